// expertctl index verify X.idx --gguf F ... [--v1-q-pack Q] [--content]
// Checks every row against the model and the packs, reporting every failure (not just the first)
// as "INDEX:LINE: ...". With --content, every Q copy is hashed (XXH3-64) and compared with the
// same expert's bytes in P. Exit 0 only when everything holds, 1 when a check failed, 2 when the
// index or model could not be read at all.
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "catalog/catalog.h"
#include "commands.h"
#include "format/index.h"
#include "model_args.h"
#include "progress.h"
#include "util/checked.h"
#include "util/file.h"
#include "util/hash.h"
#include "util/status.h"

namespace expertd::ctl {
namespace {

struct VerifyArgs {
  std::string index;
  std::vector<std::string> ggufs;
  std::string v1_q_pack;
  bool content = false;
  bool quiet = false;
  bool json = false;
};

// One Q copy whose content is compared with P.
struct ContentCheck {
  int line;
  std::string what;
  size_t q_pack;  // position in the index's packs
  uint64_t q_offset;
  ExpertLocation p;
};

class Verifier {
 public:
  Verifier(const VerifyArgs& a, const ExpertIndex& index, const ModelCatalog& catalog)
      : a_(a), index_(index), catalog_(catalog) {
    for (const MoeLayer& l : catalog.layers()) {
      for (size_t pi = 0; pi < l.projections.size(); ++pi) projection_of_[l.projections[pi].tensor] = {&l, pi};
    }
  }

  void Run() {
    OpenPacks();
    if (index_.version() == 2) CheckV2Rows();
    else CheckV1Rows();
    if (a_.content) CheckContent();
  }

  const std::vector<std::pair<int, std::string>>& failures() const { return failures_; }
  size_t rows() const { return index_.version() == 2 ? index_.rows().size() : index_.v1_rows().size(); }
  size_t content_checked() const { return content_checked_; }
  uint64_t bytes_hashed() const { return bytes_hashed_; }
  double hash_seconds() const { return hash_seconds_; }

 private:
  void Fail(int line, std::string message) { failures_.emplace_back(line, std::move(message)); }

  void OpenPacks() {
    for (const IndexPack& p : index_.packs()) {
      absl::StatusOr<ReadFile> f = ReadFile::Open(p.path);
      if (!f.ok()) {
        Fail(p.line, absl::StrCat("pack ", p.id, " (", p.label, "): ", f.status().message()));
        packs_.push_back(nullptr);
      } else {
        packs_.push_back(std::make_unique<ReadFile>(*std::move(f)));
      }
    }
    for (const PackInfo& p : catalog_.packs()) {
      absl::StatusOr<ReadFile> f = ReadFile::Open(p.path);
      p_files_.push_back(f.ok() ? std::make_unique<ReadFile>(*std::move(f)) : nullptr);
    }
  }

  // The projection a row names, or a failure.
  const std::pair<const MoeLayer*, size_t>* FindProjection(int line, const std::string& tensor) {
    const auto it = projection_of_.find(tensor);
    if (it == projection_of_.end()) {
      Fail(line, absl::StrCat("'", tensor, "' is not an expert projection of the model"));
      return nullptr;
    }
    return &it->second;
  }

  void CheckRange(int line, const std::string& what, size_t pack, uint64_t offset,
                  uint64_t bytes, const MoeLayer& layer, size_t pi, uint32_t expert) {
    if (!packs_[pack]) return;  // already reported
    if (!RangeInside(offset, bytes, packs_[pack]->size())) {
      Fail(line, absl::StrCat(what, ": [", offset, ", +", bytes, ") lies outside ",
                              packs_[pack]->path(), " (", packs_[pack]->size(), " bytes)"));
      return;
    }
    if (a_.content) {
      absl::StatusOr<ExpertLocation> p = catalog_.Locate(layer.block, expert, pi);
      if (p.ok()) checks_.push_back(ContentCheck{line, what, pack, offset, *p});
    }
  }

  void CheckV2Rows() {
    for (const IndexRow& r : index_.rows()) {
      const auto* found = FindProjection(r.line, r.tensor);
      if (!found) continue;
      const auto [layer, pi] = *found;
      const std::string what = absl::StrCat(r.tensor, " expert ", r.expert);
      if (r.expert >= layer->n_expert) {
        Fail(r.line, absl::StrCat(what, ": the layer has ", layer->n_expert, " experts"));
        continue;
      }
      const uint64_t want = layer->projections[pi].expert_bytes;
      if (r.bytes != want) {
        Fail(r.line, absl::StrCat(what, ": BYTES ", r.bytes, " differs from the expert size ",
                                  want, " (the row would be ignored)"));
        continue;
      }
      CheckRange(r.line, what, r.pack, r.offset, r.bytes, *layer, pi, r.expert);
    }
  }

  void CheckV1Rows() {
    for (const IndexV1Row& r : index_.v1_rows()) {
      const auto* found = FindProjection(r.line, r.tensor);
      if (!found) continue;
      const auto [layer, pi] = *found;
      const uint64_t want = layer->projections[pi].expert_bytes;
      if (r.expert_bytes != want) {
        Fail(r.line, absl::StrCat(r.tensor, ": EXPERT_BYTES ", r.expert_bytes,
                                  " differs from the expert size ", want,
                                  " (the row would be ignored)"));
        continue;
      }
      if (r.expert_count > layer->n_expert) {
        Fail(r.line, absl::StrCat(r.tensor, ": EXPERT_COUNT ", r.expert_count, " exceeds the ",
                                  layer->n_expert, " experts of the layer"));
        continue;
      }
      for (uint32_t e = r.q_parity; e < r.expert_count; e += 2) {
        const auto offset = CheckedAdd(r.q_base, CheckedMul(e / 2, r.expert_bytes).value_or(~0ull));
        CheckRange(r.line, absl::StrCat(r.tensor, " expert ", e), 0, offset.value_or(~0ull),
                   r.expert_bytes, *layer, pi, e);
      }
    }
  }

  void CheckContent() {
    uint64_t total = 0;
    for (const ContentCheck& c : checks_) total += c.p.bytes;
    Progress progress("verify content", 2 * total, a_.quiet);
    std::vector<uint8_t> buf;
    for (const ContentCheck& c : checks_) {
      const ReadFile* p_file = p_files_[c.p.pack].get();
      if (p_file == nullptr) {
        Fail(c.line, absl::StrCat(c.what, ": model file ", catalog_.packs()[c.p.pack].path,
                                  " cannot be opened"));
        continue;
      }
      const absl::StatusOr<uint64_t> q = Hash(*packs_[c.q_pack], c.q_offset, c.p.bytes, buf);
      const absl::StatusOr<uint64_t> p = Hash(*p_file, c.p.offset, c.p.bytes, buf);
      bytes_hashed_ += 2 * c.p.bytes;
      progress.Update(bytes_hashed_);
      ++content_checked_;
      if (!q.ok() || !p.ok()) {
        Fail(c.line, absl::StrCat(c.what, ": ", (!q.ok() ? q.status() : p.status()).message()));
      } else if (*q != *p) {
        char text[80];
        std::snprintf(text, sizeof text, " (xxh3 %016llx in Q, %016llx in P)",
                      static_cast<unsigned long long>(*q), static_cast<unsigned long long>(*p));
        Fail(c.line, absl::StrCat(c.what, ": Q copy differs from the model's bytes", text));
      }
    }
    progress.Finish();
    hash_seconds_ = progress.seconds();
  }

  static absl::StatusOr<uint64_t> Hash(const ReadFile& f, uint64_t offset, uint64_t bytes,
                                       std::vector<uint8_t>& buf) {
    constexpr uint64_t kChunk = 8 << 20;
    buf.resize(static_cast<size_t>(std::min(kChunk, bytes)));
    Xxh3Stream h;
    for (uint64_t at = 0; at < bytes; at += kChunk) {
      const std::span<uint8_t> s(buf.data(), static_cast<size_t>(std::min(kChunk, bytes - at)));
      RETURN_IF_ERROR(f.ReadAt(offset + at, s));
      h.Update(s);
    }
    return h.Digest();
  }

  const VerifyArgs& a_;
  const ExpertIndex& index_;
  const ModelCatalog& catalog_;
  absl::flat_hash_map<std::string, std::pair<const MoeLayer*, size_t>> projection_of_;
  std::vector<std::unique_ptr<ReadFile>> packs_;    // index packs; null when missing
  std::vector<std::unique_ptr<ReadFile>> p_files_;  // catalog packs (GGUF shards)
  std::vector<ContentCheck> checks_;
  std::vector<std::pair<int, std::string>> failures_;
  size_t content_checked_ = 0;
  uint64_t bytes_hashed_ = 0;
  double hash_seconds_ = 0;
};

int RunVerify(const VerifyArgs& a) {
  IndexOptions options;
  options.v1_q_pack = a.v1_q_pack;
  options.check_packs = false;  // the verifier checks packs itself and reports every failure
  absl::StatusOr<ExpertIndex> index = ExpertIndex::Read(a.index, options);
  if (!index.ok()) return PrintError("index verify", index.status()), 2;
  absl::StatusOr<GgufModel> model = OpenModelArgs(a.ggufs);
  if (!model.ok()) return PrintError("index verify", model.status()), 2;
  absl::StatusOr<ModelCatalog> catalog = ModelCatalog::Build(*model, nullptr);
  if (!catalog.ok()) return PrintError("index verify", catalog.status()), 2;

  Verifier v(a, *index, *catalog);
  v.Run();
  const bool ok = v.failures().empty();
  if (a.json) {
    nlohmann::json failures = nlohmann::json::array();
    for (const auto& [line, msg] : v.failures()) {
      failures.push_back({{"line", line}, {"message", msg}});
    }
    std::cout << nlohmann::json{{"index", a.index},
                                {"version", index->version()},
                                {"rows", v.rows()},
                                {"ok", ok},
                                {"failures", failures},
                                {"content_checked", v.content_checked()},
                                {"bytes_hashed", v.bytes_hashed()}}
                     .dump(2)
              << "\n";
  } else {
    for (const auto& [line, msg] : v.failures()) {
      std::printf("%s:%d: %s\n", a.index.c_str(), line, msg.c_str());
    }
    std::printf("%s: index v%d, %zu rows, %zu failures", a.index.c_str(), index->version(),
                v.rows(), v.failures().size());
    if (a.content) {
      const double s = v.hash_seconds();
      std::printf("; content: %zu expert copies compared, %s hashed (%s/s)", v.content_checked(),
                  HumanBytes(v.bytes_hashed()).c_str(),
                  HumanBytes(s > 0 ? static_cast<uint64_t>(v.bytes_hashed() / s) : 0).c_str());
    }
    std::printf("\n%s\n", ok ? "OK" : "FAILED");
  }
  return ok ? 0 : 1;
}

}  // namespace

void AddIndexVerifyCommand(CLI::App& index, int* exit_code) {
  auto* cmd = index.add_subcommand("verify", "Check an index against its model and packs");
  auto a = std::make_shared<VerifyArgs>();
  cmd->add_option("index", a->index, "Index file (v1 or v2)")->required();
  cmd->add_option("--gguf", a->ggufs, "Model file (any shard; repeat for shards)")->required();
  cmd->add_option("--v1-q-pack", a->v1_q_pack, "The Q pack of a v1 index");
  cmd->add_flag("--content", a->content, "Compare every Q copy with the model's bytes (xxh3)");
  cmd->add_flag("--quiet", a->quiet, "No progress output");
  cmd->add_flag("--json", a->json, "Print JSON");
  cmd->callback([a, exit_code] { *exit_code = RunVerify(*a); });
}

}  // namespace expertd::ctl
