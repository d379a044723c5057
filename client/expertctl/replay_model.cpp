#include "replay_model.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "catalog/catalog.h"
#include "device/host/host_device.h"
#include "engine/engine.h"
#include "engine/policy_sim.h"
#include "format/route_trace.h"
#include "model_args.h"
#include "progress.h"
#include "util/file.h"
#include "util/hash.h"
#include "util/status.h"

namespace expertd::ctl {
namespace {

absl::StatusOr<std::string> ModelPath(const ReplayModelArgs& a) {
  if (!a.gguf.empty()) return a.gguf;
  const std::string single = a.model_dir + "/model.gguf";
  if (std::filesystem::exists(single)) return single;
  std::vector<std::string> shards;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(a.model_dir, ec)) {
    if (e.path().extension() == ".gguf") shards.push_back(e.path().string());
  }
  if (shards.empty()) {
    return absl::NotFoundError(absl::StrCat("no .gguf file in ", a.model_dir));
  }
  std::sort(shards.begin(), shards.end());
  return shards.front();
}

// Measures single-thread memcpy bandwidth over `bytes` (the physical limit the host device's
// copies are compared with), in the same run.
double MemcpyBytesPerSecond(uint64_t bytes) {
  const size_t n = static_cast<size_t>(std::min<uint64_t>(bytes, uint64_t{256} << 20));
  std::vector<uint8_t> src(n, 1), dst(n, 0);
  std::memcpy(dst.data(), src.data(), n);  // fault the pages in first
  const auto t0 = std::chrono::steady_clock::now();
  uint64_t done = 0;
  while (done < bytes) {
    std::memcpy(dst.data(), src.data(), n);
    done += n;
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return s > 0 ? static_cast<double>(done) / s : 0;
}

}  // namespace

int RunReplayWithModel(const ReplayModelArgs& a) {
  const auto fail = [](const absl::Status& st) {
    PrintError("replay", st);
    return 2;
  };
  absl::StatusOr<std::string> path = ModelPath(a);
  if (!path.ok()) return fail(path.status());
  absl::StatusOr<GgufModel> model = GgufModel::Open(*path);
  if (!model.ok()) return fail(model.status());
  std::unique_ptr<ExpertIndex> index;
  if (!a.index.empty()) {
    IndexOptions io;
    io.v1_q_pack = a.v1_q_pack;
    absl::StatusOr<ExpertIndex> read = ExpertIndex::Read(a.index, io);
    if (!read.ok()) return fail(read.status());
    index = std::make_unique<ExpertIndex>(*std::move(read));
  }
  absl::StatusOr<ModelCatalog> catalog = ModelCatalog::Build(*model, index.get());
  if (!catalog.ok()) return fail(catalog.status());
  // The oracle reads the model's own bytes (P), so a bad copy in a Q pack is caught too.
  absl::StatusOr<ModelCatalog> model_only = ModelCatalog::Build(*model, nullptr);
  if (!model_only.ok()) return fail(model_only.status());
  absl::StatusOr<std::vector<RouteRecord>> read = ReadRouteTrace(a.trace);
  if (!read.ok()) return fail(read.status());
  // The same access order as the simulation: problem, then token, then layer; experts as listed.
  absl::StatusOr<AccessTrace> access = MakeAccessTrace(*std::move(read));
  if (!access.ok()) return fail(access.status());
  const std::vector<RouteRecord>* records = &access->groups;
  for (const RouteRecord& r : *records) {
    if (catalog->FindLayer(r.layer) == nullptr) {
      return fail(absl::InvalidArgumentError(absl::StrCat(
          a.trace, ":", r.line, ": layer ", r.layer, " is not an MoE layer of ", *path)));
    }
  }

  absl::StatusOr<ReadMethod> method = ParseReadMethod(a.read_method);
  if (!method.ok()) return fail(method.status());
  std::vector<PackSpec> specs;
  for (const PackInfo& p : catalog->packs()) {
    PackSpec spec;
    spec.path = p.path;
    spec.label = p.label;
    specs.push_back(std::move(spec));
  }
  PackSetOptions pso;
  pso.method = *method;
  absl::StatusOr<std::unique_ptr<PackSet>> packs = PackSet::Open(std::move(specs), pso);
  if (!packs.ok()) return fail(packs.status());
  absl::StatusOr<std::unique_ptr<Device>> device = MakeHostDevice();
  if (!device.ok()) return fail(device.status());

  EngineOptions eo;
  eo.policy = a.policy;
  eo.predictor = a.predictor;
  eo.readers.threads_per_group = a.reader_threads;
  if (a.capacity > 0) {
    eo.slots_per_class = a.capacity;
  } else if (a.capacity_fraction > 0) {
    // The fraction of the largest class's bundles, applied to every class.
    uint64_t most = 0;
    for (const SlotClass& sc : catalog->slot_classes()) {
      most = std::max<uint64_t>(most, uint64_t{catalog->n_expert()} * sc.layers.size());
    }
    eo.slots_per_class =
        std::max<uint32_t>(1, static_cast<uint32_t>(a.capacity_fraction * static_cast<double>(most)));
  } else {
    return fail(absl::InvalidArgumentError("give --capacity N or --capacity-fraction F"));
  }
  absl::StatusOr<std::unique_ptr<Engine>> engine =
      Engine::Create(*catalog, **packs, **device, eo);
  if (!engine.ok()) return fail(engine.status());
  std::vector<std::unique_ptr<MappedFences>> fences;  // the client's view, per slot class
  for (size_t c = 0; c < catalog->slot_classes().size(); ++c) {
    absl::StatusOr<FenceExport> ex = (*engine)->fences(static_cast<uint32_t>(c)).Export();
    if (!ex.ok()) return fail(ex.status());
    absl::StatusOr<MappedFences> mapped = MapFences(*ex);
    if (!mapped.ok()) return fail(mapped.status());
    fences.push_back(std::make_unique<MappedFences>(*std::move(mapped)));
  }

  // Expected content: XXH3 of each (layer, expert, projection) as the GGUF holds it, read once
  // per bundle with a plain pread — independent of the engine's readers and of the index.
  std::vector<std::unique_ptr<ReadFile>> oracle_files;
  for (const PackInfo& p : model_only->packs()) {
    absl::StatusOr<ReadFile> f = ReadFile::Open(p.path);
    if (!f.ok()) return fail(f.status());
    oracle_files.push_back(std::make_unique<ReadFile>(*std::move(f)));
  }
  std::map<std::tuple<uint32_t, uint32_t, size_t>, uint64_t> expected;
  std::vector<uint8_t> buf;
  uint64_t verified = 0, mismatches = 0, errors = 0;
  Progress progress("replay", records->size(), a.json, "records");
  const auto t0 = std::chrono::steady_clock::now();
  size_t done_records = 0;
  for (const RouteRecord& r : *records) {
    absl::StatusOr<Grant> g = (*engine)->Acquire(r.layer, r.experts);
    progress.Update(++done_records);
    if (!g.ok()) {
      ++errors;
      if (errors <= 5) PrintError("replay", g.status());
      continue;
    }
    const MoeLayer& layer = *catalog->FindLayer(r.layer);
    for (const GrantedSlot& s : g->slots) {
      bool ok = true;
      for (size_t p = 0; p < layer.projections.size(); ++p) {
        const uint64_t bytes = layer.projections[p].expert_bytes;
        auto [it, fresh] = expected.try_emplace({r.layer, s.expert, p}, 0);
        if (fresh) {
          const absl::StatusOr<ExpertLocation> loc = model_only->Locate(r.layer, s.expert, p);
          buf.resize(bytes);
          if (!loc.ok()) return fail(loc.status());
          if (absl::Status st = oracle_files[loc->pack]->ReadAt(loc->offset, buf); !st.ok()) {
            return fail(st);
          }
          it->second = Xxh3(buf);
        }
        const uint8_t* got = (*engine)->arena(s.slot_class, p).host_data() + s.slot * bytes;
        ok = ok && Xxh3(std::span<const uint8_t>(got, bytes)) == it->second;
      }
      ++(ok ? verified : mismatches);
      (void)fences[s.slot_class]->SignalDone(s.slot, s.generation);
    }
    (*engine)->Release(*g);
  }
  progress.Finish();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const EngineStats st = (*engine)->Stats();
  const double throughput = seconds > 0 ? static_cast<double>(st.bytes_copied) / seconds : 0;
  const double memcpy_bw = MemcpyBytesPerSecond(std::max<uint64_t>(st.bytes_copied, 64 << 20));
  const double hit_rate =
      st.pool.accesses ? static_cast<double>(st.pool.hits) / static_cast<double>(st.pool.accesses) : 0;
  if (a.json) {
    nlohmann::json per_layer = nlohmann::json::object();
    for (const auto& [block, rate] : st.layer_hit_rate) per_layer[std::to_string(block)] = rate;
    // The method each pack was read with: direct and mmap fall back where the file system
    // lacks them, and say why.
    nlohmann::json pack_methods = nlohmann::json::array();
    for (size_t i = 0; i < (*packs)->size(); ++i) {
      const PackEntry& e = (*packs)->pack(static_cast<PackId>(i));
      pack_methods.push_back({{"pack", e.label},
                              {"method", std::string(ReadMethodName(e.method))},
                              {"note", e.method_note}});
    }
    std::cout << nlohmann::json{{"trace", a.trace},
                                {"model", *path},
                                {"policy", a.policy},
                                {"predictor", a.predictor},
                                {"read_method", a.read_method},
                                {"pack_methods", pack_methods},
                                {"capacity", eo.slots_per_class},
                                {"accesses", st.pool.accesses},
                                {"hits", st.pool.hits},
                                {"joins", st.pool.joins},
                                {"hit_rate", hit_rate},
                                {"prefetch_issued", st.pool.prefetch_issued},
                                {"prefetch_used", st.pool.prefetch_used},
                                {"prefetch_wasted", st.pool.prefetch_wasted},
                                {"bytes_read", st.bytes_read},
                                {"bytes_copied", st.bytes_copied},
                                {"stall_p50_us", st.stall_p50_us},
                                {"stall_p99_us", st.stall_p99_us},
                                {"verified", verified},
                                {"mismatches", mismatches},
                                {"errors", errors},
                                {"seconds", seconds},
                                {"throughput_bytes_per_s", throughput},
                                {"memcpy_bytes_per_s", memcpy_bw},
                                {"per_layer_hit_rate", per_layer}}
                     .dump(2)
              << "\n";
  } else {
    std::printf(
        "%s on %s: policy %s, predictor %s, %u slots per class\n"
        "  accesses %llu, hits %llu (%.3f), joins %llu, prefetch issued %llu used %llu\n"
        "  read %s, copied %s in %.2f s: %s/s (single-thread memcpy %s/s, ratio %.2f)\n"
        "  acquire stall p50 %.1f us, p99 %.1f us\n"
        "  verified %llu granted bundles, %llu mismatches, %llu errors\n",
        a.trace.c_str(), path->c_str(), a.policy.c_str(), a.predictor.c_str(),
        eo.slots_per_class, static_cast<unsigned long long>(st.pool.accesses),
        static_cast<unsigned long long>(st.pool.hits), hit_rate,
        static_cast<unsigned long long>(st.pool.joins),
        static_cast<unsigned long long>(st.pool.prefetch_issued),
        static_cast<unsigned long long>(st.pool.prefetch_used), HumanBytes(st.bytes_read).c_str(),
        HumanBytes(st.bytes_copied).c_str(), seconds,
        HumanBytes(static_cast<uint64_t>(throughput)).c_str(),
        HumanBytes(static_cast<uint64_t>(memcpy_bw)).c_str(),
        memcpy_bw > 0 ? throughput / memcpy_bw : 0, st.stall_p50_us, st.stall_p99_us,
        static_cast<unsigned long long>(verified), static_cast<unsigned long long>(mismatches),
        static_cast<unsigned long long>(errors));
  }
  return mismatches == 0 && errors == 0 ? 0 : 1;
}

}  // namespace expertd::ctl
