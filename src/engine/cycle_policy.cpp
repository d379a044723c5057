// The layer-aware eviction policy "cycle", the default (docs/policy.md).
#include "engine/cycle_policy.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <deque>
#include <limits>
#include <utility>

#include "absl/container/flat_hash_map.h"

namespace expertd {
namespace {

constexpr uint64_t kNever = ~uint64_t{0};

// Layer-aware policy ("cycle"); docs/policy.md has the reasoning and the measurements. Every
// token sweeps the MoE layers in order, so a bundle of layer L is next needed, at the earliest,
// when the sweep returns to L: after k = (pos(L) - pos(c)) mod n layer steps from the current
// layer c (n when L is c), and its j-th next chance comes k + n * j steps from now. With
// p_j = P(used at that chance), keeping the bundle until its next use, but at most j chances,
// occupies a slot for E_j expected steps and earns P_j = 1 - prod_{i<j} (1 - p_i) hits. The
// policy evicts the bundle with the fewest hits per slot-step at its best horizon, i.e. the
// largest min_j E_j / P_j (j = infinity gives the expected time to its next use). The p_j come
// from tables learned online from outcomes:
//  * history: (visits of L since the bundle's last use, capped; its decayed use rate) -> P(use);
//  * token matching: the current token's route so far is matched against the last 255 tokens;
//    the tokens that followed the best matches vote on the next tokens' routes (text repeats,
//    and a token's route across layers identifies it well). A calibration table maps (tokens
//    ahead, vote, history cell) to P(use), so votes count only as far as they have predicted.
// Beyond kHorizon tokens the history hazard alone extends the estimate. All times are scaled
// by r = 1 / (1 - q), q the share of acquires that repeat the previous acquire's layer: a stream
// that dwells on one layer (prefill acquired token by token) keeps that layer's bundles.
//
// Cost: OnAccess O(ring words + set bits); OnLayer O(known experts of the layer * kHorizon);
// ChooseVictim O(resident) up to kFullScanLimit resident bundles, above that the best of
// kSample deterministic random picks (O(1) in the pool size), each scored in O(kHorizon *
// kMatches).
class CyclePolicy final : public EvictionPolicy {
 public:
  CyclePolicy(const PolicyModel& model, uint32_t capacity);
  std::string_view name() const override { return "cycle"; }
  void OnInsert(SlotId slot, const BundleKey& key, uint64_t now) override;
  void OnPrefetch(SlotId slot, const BundleKey& key, uint64_t now) override;
  void OnAccess(SlotId slot, const BundleKey& key, uint64_t now) override;
  void OnRemove(SlotId slot) override;
  void OnLayer(uint32_t layer, uint64_t now) override;
  std::optional<SlotId> ChooseVictim(const std::function<bool(SlotId)>& evictable,
                                     uint64_t now) override;

 private:
  // Chosen on the real Mixtral traces and synthetic ones; docs/policy.md lists the effect of each.
  static constexpr uint32_t kMaxAge = 3;  // visits since last use, capped
  // Decayed use rate relative to the base rate (top-k / experts), in half-octave buckets from
  // 2^-3 up: fine-grained models spread popularity over two orders of magnitude.
  static constexpr uint32_t kRateBuckets = 14;
  static constexpr double kRateStepsPerOctave = 2;
  static constexpr double kRateMinLog2 = -3;
  static constexpr double kRateDecay = 0.985;       // per visit of the layer
  static constexpr uint32_t kRingTokens = 256;      // past tokens matched against
  static constexpr uint32_t kMatches = 5;           // best matches that vote
  static constexpr uint32_t kHorizon = 4;           // tokens ahead predicted by votes
  static constexpr uint32_t kVoteLevels = 4;        // vote share quantized to 0..kVoteLevels
  static constexpr double kPrevTokenWeight = 0.25;  // weight of the previous token's match
  static constexpr double kPriorWeight = 4;         // pseudo-observations behind each table cell
  static constexpr double kRepeatAlpha = 1.0 / 16;
  static constexpr uint32_t kRefresh = 64;  // victim choices between table refreshes
  static constexpr uint32_t kFullScanLimit = 1024;
  static constexpr uint32_t kSample = 256;
  static constexpr uint32_t kCells = (kMaxAge + 1) * kRateBuckets;
  static constexpr uint32_t kVoteBuckets = kVoteLevels + 2;  // "no vote", 0..kVoteLevels

  struct Bundle {
    BundleKey key;
    uint32_t layer_pos = 0;
    uint64_t last_use_visit = 0;  // visit number of its layer at its last use
    double count = 0;             // decayed uses, as of `count_visit`
    double log2_count = -1e9;     // log2(count)
    uint64_t count_visit = 0;
    // Bit t % kRingTokens: token t used it, for the tokens in the window (see Oldest()).
    std::array<uint64_t, kRingTokens / 64> used_by{};
    uint64_t pending_visit = 0;     // the visit whose cells await this bundle's outcome
    std::vector<uint32_t> pending;  // hazard cell, then calibration cells
    // Prefetched for this visit number of its layer (0: not expected): until that visit its
    // first chance counts at least the predictor's learned accuracy.
    uint64_t expected_visit = 0;
    uint64_t prefetch_trial_visit = 0;  // the visit whose prefetch trial awaits its outcome
  };
  struct Layer {
    uint32_t block = 0;
    uint64_t visits = 0;
    uint64_t last_token = kNever;  // the last token that visited it
    std::vector<uint32_t> bundles;
  };
  struct Snapshot {  // votes on token made_at + offset, cast when token made_at ended
    uint64_t made_at = 0;
    uint32_t offset = 0;
    double avail = 0;
    absl::flat_hash_map<uint32_t, double> weight;  // bundle -> weight of votes for it
  };
  struct Match {
    uint64_t token;
    double weight;
  };

  uint32_t LayerPos(uint32_t block);
  uint32_t BundleIndex(const BundleKey& key);
  uint32_t HistoryCell(const Bundle& b, uint64_t visits, uint32_t extra_age) const;
  double Hazard(uint32_t cell) const;
  double Calibrated(uint32_t offset, int vote, uint32_t cell) const;
  int Vote(uint32_t bundle, uint32_t offset) const;
  void EndToken();
  void RankMatches();
  void Refresh();
  double StepsPerHit(uint32_t bundle) const;
  static bool UsedBy(const Bundle& b, uint64_t token) {
    const uint64_t bit = token % kRingTokens;
    return (b.used_by[bit / 64] >> (bit % 64)) & 1;
  }
  // The oldest past token that can match: kRingTokens - 1 of them, so that no past token shares
  // the current token's bit.
  uint64_t Oldest() const { return cur_token_ >= kRingTokens ? cur_token_ - kRingTokens + 1 : 0; }

  double base_rate_;
  double log2_decay_ = std::log2(kRateDecay);
  double rate_offset_ = 0;     // log2((1 - kRateDecay) / base_rate_) - kRateMinLog2
  std::vector<Layer> layers_;  // in visiting order
  absl::flat_hash_map<uint32_t, uint32_t> pos_of_;
  std::vector<Bundle> bundles_;
  absl::flat_hash_map<BundleKey, uint32_t> index_;
  std::vector<int64_t> slot_bundle_;
  std::vector<SlotId> resident_;
  std::vector<uint32_t> resident_at_;

  // Where the sweep is.
  bool in_token_ = false;
  uint32_t cur_pos_ = 0;
  uint64_t visit_id_ = 0;
  double repeat_ = 0;
  bool have_prev_layer_ = false;
  uint32_t prev_layer_ = 0;

  // Token matching.
  uint64_t cur_token_ = 0;
  std::vector<uint32_t> cur_route_;
  std::vector<std::vector<uint32_t>> ring_;  // route of token t at t % kRingTokens
  std::vector<double> score_, bonus_;        // by token % kRingTokens
  std::vector<Match> top_;
  std::array<double, kHorizon + 1> avail_past_{}, avail_current_{};  // by offset
  bool top_dirty_ = true;
  std::deque<Snapshot> snapshots_;

  // Learned tables: hits and observations per cell.
  std::vector<double> hz_hits_, hz_count_, cal_hits_, cal_count_;
  std::vector<double> failed_visits_;  // F for a history cell with no votes, per cell
  // Prefetch accuracy: visits a prefetched bundle was expected at, and those that used it.
  double prefetch_hits_ = 0.5 * kPriorWeight;
  double prefetch_trials_ = kPriorWeight;
  uint32_t since_refresh_ = kRefresh;
  uint64_t rng_ = 0x9e3779b97f4a7c15ULL;
};

CyclePolicy::CyclePolicy(const PolicyModel& model, uint32_t capacity)
    : ring_(kRingTokens),
      score_(kRingTokens, 0),
      bonus_(kRingTokens, 0),
      hz_hits_(kCells),
      hz_count_(kCells, kPriorWeight),
      cal_hits_(size_t{kHorizon} * kVoteBuckets * kCells, 0),
      cal_count_(size_t{kHorizon} * kVoteBuckets * kCells, 0),
      failed_visits_(kCells, 0) {
  base_rate_ = model.n_expert > 0 && model.n_expert_used > 0
                   ? std::min(1.0, double(model.n_expert_used) / model.n_expert)
                   : 0.25;
  std::fill(hz_hits_.begin(), hz_hits_.end(), base_rate_ * kPriorWeight);
  rate_offset_ = std::log2((1 - kRateDecay) / base_rate_) - kRateMinLog2;
  for (uint32_t block : model.layers) LayerPos(block);
  slot_bundle_.assign(capacity, -1);
  resident_at_.assign(capacity, 0);
}

uint32_t CyclePolicy::LayerPos(uint32_t block) {
  if (const auto it = pos_of_.find(block); it != pos_of_.end()) return it->second;
  // A layer the model did not list: keep block order (rare; positions of later layers shift).
  const auto at = std::lower_bound(layers_.begin(), layers_.end(), block,
                                   [](const Layer& l, uint32_t b) { return l.block < b; });
  const auto inserted = static_cast<uint32_t>(at - layers_.begin());
  Layer layer;
  layer.block = block;
  layers_.insert(at, std::move(layer));
  if (in_token_ && inserted <= cur_pos_) ++cur_pos_;
  pos_of_.clear();
  for (uint32_t i = 0; i < layers_.size(); ++i) pos_of_[layers_[i].block] = i;
  for (Bundle& b : bundles_) b.layer_pos = pos_of_[b.key.layer];
  return pos_of_[block];
}

uint32_t CyclePolicy::BundleIndex(const BundleKey& key) {
  const auto [it, inserted] = index_.try_emplace(key, static_cast<uint32_t>(bundles_.size()));
  if (inserted) {
    Bundle b;
    b.key = key;
    b.layer_pos = LayerPos(key.layer);
    bundles_.push_back(std::move(b));
    layers_[bundles_.back().layer_pos].bundles.push_back(it->second);
  }
  return it->second;
}

// History cell of a bundle as seen from its layer's visit number `visits` + 1: visits since its
// last use (0 = used at visit `visits`) and its decayed use rate relative to the base rate.
uint32_t CyclePolicy::HistoryCell(const Bundle& b, uint64_t visits, uint32_t extra_age) const {
  const uint64_t age = std::min<uint64_t>(visits - b.last_use_visit + extra_age, kMaxAge);
  // log2 of the rate, in half octaves above 2^kRateMinLog2: no pow/log on this path.
  const double step = (b.log2_count + double(visits - b.count_visit) * log2_decay_ + rate_offset_) *
                      kRateStepsPerOctave;
  const auto bucket = static_cast<uint32_t>(std::clamp(step, 0.0, double(kRateBuckets - 1)));
  return static_cast<uint32_t>(age) * kRateBuckets + bucket;
}

double CyclePolicy::Hazard(uint32_t cell) const {
  return std::clamp(hz_hits_[cell] / hz_count_[cell], 1e-3, 1.0);
}

double CyclePolicy::Calibrated(uint32_t offset, int vote, uint32_t cell) const {
  const size_t i = (size_t{offset - 1} * kVoteBuckets + (vote + 1)) * kCells + cell;
  return std::clamp((cal_hits_[i] + Hazard(cell) * kPriorWeight) / (cal_count_[i] + kPriorWeight),
                    1e-3, 1.0);
}

// Vote of the best matches on whether `bundle` is used by the token `offset` tokens after the
// one each match stands for: -1 when no match has such a token yet, else the weighted share
// quantized to 0..kVoteLevels.
int CyclePolicy::Vote(uint32_t bundle, uint32_t offset) const {
  const Bundle& b = bundles_[bundle];
  const bool layer_seen = layers_[b.layer_pos].last_token == cur_token_;
  const double avail = avail_past_[offset] + (layer_seen ? avail_current_[offset] : 0);
  if (avail == 0) return -1;
  double yes = 0;
  for (const Match& m : top_) {
    const uint64_t t = m.token + offset;
    if (t < cur_token_) {
      if (UsedBy(b, t)) yes += m.weight;
    } else if (t == cur_token_ && layer_seen && UsedBy(b, t)) {
      yes += m.weight;
    }
  }
  return static_cast<int>(std::lround(yes / avail * kVoteLevels));
}

// The best kMatches past tokens by similarity of their route to the current token's route so far
// (plus a share of the previous tokens' similarity), most recent first among equals. Weights are
// the margin over the first token left out, so clear winners count more.
void CyclePolicy::RankMatches() {
  top_dirty_ = false;
  top_.clear();
  std::vector<Match> all;
  for (uint64_t t = Oldest(); t < cur_token_; ++t) {
    const size_t i = t % kRingTokens;
    all.push_back(Match{t, score_[i] + kPrevTokenWeight * bonus_[i]});
  }
  const size_t keep = std::min<size_t>(kMatches + 1, all.size());
  std::partial_sort(all.begin(), all.begin() + keep, all.end(), [](const Match& a, const Match& b) {
    return a.weight != b.weight ? a.weight > b.weight : a.token > b.token;
  });
  const double floor = all.size() > kMatches ? all[kMatches].weight : 0;
  for (size_t i = 0; i < std::min<size_t>(kMatches, all.size()); ++i) {
    top_.push_back(Match{all[i].token, all[i].weight - floor + 1});
  }
  // Vote weight available per offset: from past tokens, and from the current token (which
  // counts only for layers it has visited).
  std::fill(avail_past_.begin(), avail_past_.end(), 0);
  std::fill(avail_current_.begin(), avail_current_.end(), 0);
  for (const Match& m : top_) {
    for (uint32_t offset = 1; offset <= kHorizon; ++offset) {
      if (m.token + offset < cur_token_) avail_past_[offset] += m.weight;
      if (m.token + offset == cur_token_) avail_current_[offset] += m.weight;
    }
  }
}

// The current token's sweep is over: cast its votes on the next kHorizon tokens (for the
// calibration tables), and make it a match candidate.
void CyclePolicy::EndToken() {
  RankMatches();
  for (uint32_t offset = 1; offset <= kHorizon; ++offset) {
    Snapshot snap{cur_token_, offset, 0, {}};
    for (const Match& m : top_) {
      const uint64_t t = m.token + offset;
      if (t > cur_token_) continue;
      snap.avail += m.weight;
      const std::vector<uint32_t>& route = t == cur_token_ ? cur_route_ : ring_[t % kRingTokens];
      for (uint32_t b : route) snap.weight[b] += m.weight;
    }
    snapshots_.push_back(std::move(snap));
  }
  while (!snapshots_.empty() && snapshots_.front().made_at + kHorizon <= cur_token_) {
    snapshots_.pop_front();
  }
  // A candidate's bonus is how well its predecessor matched the token that just ended.
  std::vector<double> bonus(kRingTokens, 0);
  for (uint64_t t = Oldest(); t < cur_token_; ++t) {
    bonus[(t + 1) % kRingTokens] = score_[t % kRingTokens];
  }
  bonus_ = std::move(bonus);
  // The oldest token leaves the window: its bit becomes the next token's.
  if (cur_token_ + 1 >= kRingTokens) {
    const uint64_t bit = (cur_token_ + 1) % kRingTokens;
    for (uint32_t bi : ring_[bit]) bundles_[bi].used_by[bit / 64] &= ~(uint64_t{1} << (bit % 64));
  }
  ring_[cur_token_ % kRingTokens] = std::move(cur_route_);
  cur_route_.clear();
  std::fill(score_.begin(), score_.end(), 0);
  ++cur_token_;
  top_dirty_ = true;
}

void CyclePolicy::OnLayer(uint32_t layer, uint64_t) {
  const uint32_t pos = LayerPos(layer);
  const bool same = have_prev_layer_ && layer == prev_layer_;
  repeat_ += kRepeatAlpha * ((same ? 1.0 : 0.0) - repeat_);
  have_prev_layer_ = true;
  prev_layer_ = layer;
  if (in_token_ && pos <= cur_pos_) EndToken();
  in_token_ = true;
  cur_pos_ = pos;
  ++visit_id_;
  Layer& l = layers_[pos];
  ++l.visits;
  l.last_token = cur_token_;
  // Open this visit's observations: every known bundle of the layer is a trial of its history
  // cell and of each vote cast on this token; OnAccess records the successes.
  for (uint32_t bi : l.bundles) {
    Bundle& b = bundles_[bi];
    if (b.expected_visit == l.visits) {  // a prefetch expected this visit to use it
      prefetch_trials_ += 1;
      b.prefetch_trial_visit = visit_id_;
      b.expected_visit = 0;
    }
    const uint32_t cell = HistoryCell(b, l.visits - 1, 0);
    b.pending_visit = visit_id_;
    b.pending.assign(1, cell);
    hz_count_[cell] += 1;
    for (const Snapshot& s : snapshots_) {
      if (s.made_at + s.offset != cur_token_) continue;
      int vote = -1;
      if (s.avail > 0) {
        const auto it = s.weight.find(bi);
        const double yes = it == s.weight.end() ? 0 : it->second;
        vote = static_cast<int>(std::lround(yes / s.avail * kVoteLevels));
      }
      const uint32_t i = (uint32_t{s.offset - 1} * kVoteBuckets + (vote + 1)) * kCells + cell;
      cal_count_[i] += 1;
      b.pending.push_back(i);
    }
  }
}

void CyclePolicy::OnInsert(SlotId slot, const BundleKey& key, uint64_t) {
  OnRemove(slot);
  if (slot >= slot_bundle_.size()) {
    slot_bundle_.resize(size_t{slot} + 1, -1);
    resident_at_.resize(size_t{slot} + 1, 0);
  }
  slot_bundle_[slot] = BundleIndex(key);
  resident_at_[slot] = static_cast<uint32_t>(resident_.size());
  resident_.push_back(slot);
}

void CyclePolicy::OnPrefetch(SlotId slot, const BundleKey& key, uint64_t now) {
  OnInsert(slot, key, now);
  Bundle& b = bundles_[slot_bundle_[slot]];
  // Visits are counted when they start, so the next one (whether or not the sweep is in the
  // layer now) is visits + 1.
  b.expected_visit = layers_[b.layer_pos].visits + 1;
}

void CyclePolicy::OnRemove(SlotId slot) {
  if (slot >= slot_bundle_.size() || slot_bundle_[slot] < 0) return;
  slot_bundle_[slot] = -1;
  const uint32_t at = resident_at_[slot];
  resident_[at] = resident_.back();
  resident_at_[resident_[at]] = at;
  resident_.pop_back();
}

void CyclePolicy::OnAccess(SlotId slot, const BundleKey& key, uint64_t now) {
  if (slot >= slot_bundle_.size() || slot_bundle_[slot] < 0 ||
      bundles_[slot_bundle_[slot]].key != key) {
    OnInsert(slot, key, now);
  }
  if (!in_token_ || LayerPos(key.layer) != cur_pos_) OnLayer(key.layer, now);
  const uint32_t bi = static_cast<uint32_t>(slot_bundle_[slot]);
  Bundle& b = bundles_[bi];
  const uint64_t visits = layers_[b.layer_pos].visits;
  if (b.prefetch_trial_visit == visit_id_) {  // the visit a prefetch expected: it was right
    prefetch_hits_ += 1;
    b.prefetch_trial_visit = 0;
  }
  if (b.pending_visit == visit_id_) {  // first use in this visit: a success for its cells
    hz_hits_[b.pending[0]] += 1;
    for (size_t i = 1; i < b.pending.size(); ++i) cal_hits_[b.pending[i]] += 1;
    b.pending_visit = 0;
  }
  if (b.count == 0 || b.last_use_visit != visits) {
    b.count = b.count * std::pow(kRateDecay, double(visits - b.count_visit)) + 1;
    b.log2_count = std::log2(b.count);
    b.count_visit = visits;
    b.last_use_visit = visits;
  }
  if (!UsedBy(b, cur_token_)) {
    // Every past token that also used this bundle matches the current token a little better.
    for (uint32_t w = 0; w < b.used_by.size(); ++w) {
      for (uint64_t bits = b.used_by[w]; bits != 0; bits &= bits - 1) {
        score_[w * 64 + std::countr_zero(bits)] += 1;
      }
    }
    const uint64_t bit = cur_token_ % kRingTokens;
    b.used_by[bit / 64] |= uint64_t{1} << (bit % 64);
    cur_route_.push_back(bi);
    top_dirty_ = true;
  }
}

// F per history cell when no votes are known: F(a) = (1 - h(a)) (1 + F(a + 1)), and for the
// capped age the geometric closed form (1 - h) / h.
void CyclePolicy::Refresh() {
  since_refresh_ = 0;
  for (uint32_t rate = 0; rate < kRateBuckets; ++rate) {
    double f = 0;
    for (int age = kMaxAge; age >= 0; --age) {
      const uint32_t cell = static_cast<uint32_t>(age) * kRateBuckets + rate;
      const double h = Hazard(cell);
      f = age == static_cast<int>(kMaxAge) ? (1 - h) / h : (1 - h) * (1 + f);
      failed_visits_[cell] = f;
    }
  }
}

double CyclePolicy::StepsPerHit(uint32_t bi) const {
  const Bundle& b = bundles_[bi];
  const uint32_t n = static_cast<uint32_t>(layers_.size());
  const uint64_t visits = layers_[b.layer_pos].visits;
  if (repeat_ >= 0.5 && b.layer_pos == cur_pos_) {
    return 1 + failed_visits_[HistoryCell(b, visits, 0)];
  }
  const uint32_t k = b.layer_pos > cur_pos_ ? b.layer_pos - cur_pos_ : b.layer_pos + n - cur_pos_;
  const uint32_t first_offset = b.layer_pos > cur_pos_ ? 0 : 1;  // next visit: this token or next
  // Visit i of L comes k + n * i steps from now. Keeping the bundle up to its first use or for
  // at most j visits costs E_j slot-steps and earns P_j hits; the bundle is worth its best
  // hits per slot-step over j (to the end: E[time to next use]). Returned inverted, so larger
  // is a better victim.
  double survive = 1, time_if_used = 0, best = std::numeric_limits<double>::infinity();
  for (uint32_t j = 0;; ++j) {
    const uint32_t offset = first_offset + j;
    const uint32_t cell = HistoryCell(b, visits, j);
    const double at = k + double(n) * j;
    if (offset > kHorizon) {
      best = std::min(best, time_if_used + survive * (at + double(n) * failed_visits_[cell]));
      break;
    }
    double p = offset == 0 ? Hazard(cell) : Calibrated(offset, Vote(bi, offset), cell);
    // Prefetched for its next visit: at least as likely as the predictor has been right.
    if (j == 0 && b.expected_visit == visits + 1)
      p = std::max(p, prefetch_hits_ / prefetch_trials_);
    time_if_used += survive * p * at;
    survive *= 1 - p;
    best = std::min(best, (time_if_used + survive * at) / (1 - survive));
  }
  const double spread = 1 / (1 - std::min(repeat_, 0.99));
  return spread * best;
}

std::optional<SlotId> CyclePolicy::ChooseVictim(const std::function<bool(SlotId)>& evictable,
                                                uint64_t) {
  if (resident_.empty()) return std::nullopt;
  if (since_refresh_++ >= kRefresh) Refresh();
  if (top_dirty_) RankMatches();
  std::optional<SlotId> best;
  double best_t = -1;
  const auto consider = [&](SlotId slot) {
    if (!evictable(slot)) return;
    const double t = StepsPerHit(static_cast<uint32_t>(slot_bundle_[slot]));
    if (t > best_t || (t == best_t && slot < *best)) best = slot, best_t = t;
  };
  if (resident_.size() > kFullScanLimit) {
    // Large pools: the best of a deterministic sample (xorshift), O(kSample) per eviction.
    for (uint32_t i = 0; i < kSample; ++i) {
      rng_ ^= rng_ << 13, rng_ ^= rng_ >> 7, rng_ ^= rng_ << 17;
      consider(resident_[rng_ % resident_.size()]);
    }
    if (best) return best;
  }
  for (SlotId slot = 0; slot < slot_bundle_.size(); ++slot) {
    if (slot_bundle_[slot] >= 0) consider(slot);
  }
  return best;
}

}  // namespace

std::unique_ptr<EvictionPolicy> MakeCyclePolicy(const PolicyModel& model, uint32_t capacity) {
  return std::make_unique<CyclePolicy>(model, capacity);
}

}  // namespace expertd
