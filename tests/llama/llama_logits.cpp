// A fixed-input greedy decode through llama.cpp's C API, for comparing runs bit for bit:
// evaluates a prompt of token ids, then greedily decodes N steps, and writes the full logits row
// of every step (the prompt's last position, then each decoded token) as float32 to OUT.
//
//   llama_logits MODEL.gguf OUT [--tokens 1,2,3] [--steps N] [--threads T] [--ctx N]
//                [--no-repack] [--no-mmap] [--ubatch N] [--poll P] [--ngl N]
//
// --ngl N offloads N layers to a GPU (llama.cpp's --n-gpu-layers; default 0: the CPU only).
// --no-mmap reads the model's weights into memory instead of mapping the file (llama.cpp's
// --no-mmap).
// --poll P gives the context a ggml CPU threadpool whose idle workers poll at level P (0: they
// sleep instead of spinning), rather than llama.cpp's default threadpool.
//
// Everything else (expertd included, through LLAMA_ARG_EXPERTD / LLAMA_ARG_EXPERTD_MODEL) comes
// from llama.cpp's defaults. Prints the decoded token ids, the first step's logits mean and
// spread, a timing line (prompt and decode, wall clock) and a memory line (peak RSS; at the end,
// RSS split into private and shared pages). Exit 0 when every step decoded with finite, non-constant logits; 1 when a decode failed
// or a logit was NaN/Inf or all were equal; 2 on usage or load errors.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <fstream>
#include <sys/resource.h>

#include "ggml-cpu.h"
#include "llama.h"

namespace {

std::vector<llama_token> ParseTokens(const char* list) {
  std::vector<llama_token> out;
  for (const char* p = list; *p != '\0';) {
    char* end = nullptr;
    out.push_back(static_cast<llama_token>(std::strtol(p, &end, 10)));
    p = *end == ',' ? end + 1 : end;
    if (end == p && *p != '\0') break;
  }
  return out;
}

// "Rss", "Private_Clean", ... of /proc/self/smaps_rollup in KiB (0 when absent).
long SmapsKiB(const std::string& key) {
  std::ifstream in("/proc/self/smaps_rollup");
  std::string line;
  const std::string prefix = key + ":";
  while (std::getline(in, line)) {
    if (line.compare(0, prefix.size(), prefix) == 0) return std::atol(line.c_str() + prefix.size());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: llama_logits MODEL.gguf OUT [--tokens 1,2,3] [--steps N] "
                         "[--threads T] [--ctx N] [--no-repack] [--no-mmap] [--ubatch N] [--poll P] "
                         "[--ngl N]\n");
    return 2;
  }
  const char* model_path = argv[1];
  const char* out_path = argv[2];
  std::vector<llama_token> prompt = {1, 300, 301, 302, 303, 304, 305, 306};
  int steps = 32, threads = 2, n_ctx = 256, ubatch = 512, poll = -1, ngl = 0;
  bool repack = true, mmap = true;
  for (int i = 3; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--tokens" && has_value) {
      prompt = ParseTokens(argv[++i]);
    } else if (a == "--steps" && has_value) {
      steps = std::atoi(argv[++i]);
    } else if (a == "--threads" && has_value) {
      threads = std::atoi(argv[++i]);
    } else if (a == "--ctx" && has_value) {
      n_ctx = std::atoi(argv[++i]);
    } else if (a == "--ubatch" && has_value) {
      ubatch = std::atoi(argv[++i]);
    } else if (a == "--poll" && has_value) {
      poll = std::atoi(argv[++i]);
    } else if (a == "--ngl" && has_value) {
      ngl = std::atoi(argv[++i]);
    } else if (a == "--no-repack") {
      repack = false;
    } else if (a == "--no-mmap") {
      mmap = false;
    } else {
      std::fprintf(stderr, "llama_logits: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (prompt.empty() || steps < 0) {
    std::fprintf(stderr, "llama_logits: an empty prompt or negative steps\n");
    return 2;
  }

  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = ngl;
  mp.use_extra_bufts = repack;
  if (!mmap) mp.load_mode = LLAMA_LOAD_MODE_NONE;
  llama_model* model = llama_model_load_from_file(model_path, mp);
  if (model == nullptr) {
    std::fprintf(stderr, "llama_logits: cannot load %s\n", model_path);
    return 2;
  }
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = static_cast<uint32_t>(n_ctx);
  cp.n_batch = static_cast<uint32_t>(std::max<size_t>(prompt.size(), 1));
  cp.n_ubatch = static_cast<uint32_t>(ubatch);
  cp.n_threads = threads;
  cp.n_threads_batch = threads;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (ctx == nullptr) {
    std::fprintf(stderr, "llama_logits: cannot create a context\n");
    llama_model_free(model);
    return 2;
  }
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  ggml_threadpool* pool = nullptr;
  if (poll >= 0) {
    ggml_threadpool_params tpp = ggml_threadpool_params_default(threads);
    tpp.poll = static_cast<uint32_t>(poll);
    pool = ggml_threadpool_new(&tpp);
    llama_attach_threadpool(ctx, pool, pool);
  }

  FILE* out = std::fopen(out_path, "wb");
  if (out == nullptr) {
    std::fprintf(stderr, "llama_logits: cannot write %s\n", out_path);
    return 2;
  }
  int rc = 0;
  std::vector<llama_token> next = prompt;
  std::printf("tokens:");
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  auto t_prompt = t0;
  int decoded = 0;
  for (int step = 0; step <= steps; ++step) {
    const int32_t ret =
        llama_decode(ctx, llama_batch_get_one(next.data(), static_cast<int32_t>(next.size())));
    if (ret != 0) {
      std::fprintf(stderr, "\nllama_logits: decode of step %d failed (%d)\n", step, ret);
      rc = 1;
      break;
    }
    const float* logits = llama_get_logits_ith(ctx, -1);
    std::fwrite(logits, sizeof(float), static_cast<size_t>(n_vocab), out);
    int best = 0;
    double sum = 0, sum2 = 0;
    bool finite = true;
    for (int v = 0; v < n_vocab; ++v) {
      finite = finite && std::isfinite(logits[v]);
      sum += logits[v];
      sum2 += static_cast<double>(logits[v]) * logits[v];
      if (logits[v] > logits[best]) best = v;
    }
    const double mean = sum / n_vocab;
    const double spread = std::sqrt(std::max(0.0, sum2 / n_vocab - mean * mean));
    if (!finite || !(spread > 0)) {
      std::fprintf(stderr, "\nllama_logits: step %d: %s logits (mean %g, spread %g)\n", step,
                   finite ? "constant" : "non-finite", mean, spread);
      rc = 1;
      break;
    }
    std::printf(" %d", best);
    if (step == 0) {
      std::fprintf(stderr, "step 0: logits mean %.4f spread %.4f\n", mean, spread);
      t_prompt = clock::now();
    } else {
      ++decoded;
    }
    next.assign(1, best);
  }
  std::printf("\n");
  const auto t_end = clock::now();
  const double prompt_ms = std::chrono::duration<double, std::milli>(t_prompt - t0).count();
  const double decode_ms = std::chrono::duration<double, std::milli>(t_end - t_prompt).count();
  std::fprintf(stderr, "timing: prompt %zu tokens in %.1f ms (%.1f tokens/s); decode %d tokens in %.1f ms "
               "(%.2f tokens/s, %.3f ms/token)\n", prompt.size(), prompt_ms,
               prompt.size() * 1000.0 / std::max(prompt_ms, 1e-9), decoded, decode_ms,
               decoded * 1000.0 / std::max(decode_ms, 1e-9), decoded ? decode_ms / decoded : 0.0);
  std::fclose(out);
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const long priv = SmapsKiB("Private_Clean") + SmapsKiB("Private_Dirty");
  std::fprintf(stderr, "memory: peak rss %.0f MiB; at the end rss %.0f MiB, private %.0f MiB, shared %.0f MiB\n",
               usage.ru_maxrss / 1024.0, SmapsKiB("Rss") / 1024.0, priv / 1024.0,
               (SmapsKiB("Rss") - priv) / 1024.0);
  llama_free(ctx);
  if (pool != nullptr) ggml_threadpool_free(pool);
  llama_model_free(model);
  llama_backend_free();
  return rc;
}
