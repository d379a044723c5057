/* Tests of the C API (client/lib/expertd_client.h), compiled as C99 so the header is checked as
 * C. Two modes:
 *
 *   client_c_api_test                      what runs without a daemon: the version, error
 *                                          objects, NULL arguments, an unreachable socket
 *   client_c_api_test --daemon EXPERTD     starts `EXPERTD --demo` on a socket in a temporary
 *                                          folder, runs a full session through the C API
 *                                          against it, then stops it with SIGTERM (exit 0)
 *
 * Granted bytes are compared with the demo model's GGUF file, at offsets read by
 * tests/support/gguf_tensors.py (not the project's parser). Every mismatch prints file:line and a reason; the
 * exit status is 1 if any check failed. */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "expertd_client.h"

extern char** environ;

static int failures = 0;
static pid_t daemon_pid = -1;
static char work_dir[256] = "";

static void cleanup(void) {
  if (daemon_pid > 0) {
    kill(daemon_pid, SIGKILL);
    waitpid(daemon_pid, NULL, 0);
    daemon_pid = -1;
  }
}

#define EXPECT(cond, ...)                                             \
  do {                                                                \
    if (!(cond)) {                                                    \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                   \
      fprintf(stderr, "\n");                                          \
      ++failures;                                                     \
    }                                                                 \
  } while (0)

/* A failed REQUIRE ends the test (the daemon is killed first). */
#define REQUIRE(cond, ...)                                            \
  do {                                                                \
    if (!(cond)) {                                                    \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                   \
      fprintf(stderr, "\n");                                          \
      cleanup();                                                      \
      exit(1);                                                        \
    }                                                                 \
  } while (0)

/* The call must succeed; otherwise its code and message are printed and the test ends. */
#define OK(call)                                                                \
  do {                                                                          \
    EXPERTD_Error* ok_err_ = (call);                                            \
    if (ok_err_ != NULL) {                                                      \
      fprintf(stderr, "FAIL %s:%d: %s: %s: %s\n", __FILE__, __LINE__, #call,    \
              EXPERTD_ErrorCodeString(ok_err_), EXPERTD_ErrorMessage(ok_err_)); \
      EXPERTD_ErrorDelete(ok_err_);                                             \
      cleanup();                                                                \
      exit(1);                                                                  \
    }                                                                           \
  } while (0)

/* The call must fail with `code` and a non-empty message. */
#define EXPECT_CODE(call, code) expect_code((call), (code), #call, __FILE__, __LINE__)

static void expect_code(EXPERTD_Error* err, EXPERTD_Error_Code code, const char* what,
                        const char* file, int line) {
  if (err == NULL) {
    fprintf(stderr, "FAIL %s:%d: %s succeeded; expected error code %d\n", file, line, what,
            (int)code);
    ++failures;
    return;
  }
  if (EXPERTD_ErrorCode(err) != code) {
    fprintf(stderr, "FAIL %s:%d: %s: code %s (%d), expected %d: %s\n", file, line, what,
            EXPERTD_ErrorCodeString(err), (int)EXPERTD_ErrorCode(err), (int)code,
            EXPERTD_ErrorMessage(err));
    ++failures;
  } else if (EXPERTD_ErrorMessage(err)[0] == '\0') {
    fprintf(stderr, "FAIL %s:%d: %s: empty message\n", file, line, what);
    ++failures;
  } else {
    printf("  ok: %s -> %s: %s\n", what, EXPERTD_ErrorCodeString(err), EXPERTD_ErrorMessage(err));
  }
  EXPERTD_ErrorDelete(err);
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- Without a daemon ------------------------------------------------------------------------ */

static void test_version(void) {
  uint32_t major = 0, minor = 0;
  OK(EXPERTD_ApiVersion(&major, &minor));
  EXPECT(major == EXPERTD_CLIENT_API_VERSION_MAJOR && minor == EXPERTD_CLIENT_API_VERSION_MINOR,
         "library %u.%u, header %d.%d", major, minor, EXPERTD_CLIENT_API_VERSION_MAJOR,
         EXPERTD_CLIENT_API_VERSION_MINOR);
  EXPECT(major >= 1, "major %u", major);
  EXPECT_CODE(EXPERTD_ApiVersion(NULL, &minor), EXPERTD_ERROR_INVALID_ARGUMENT);
  EXPECT_CODE(EXPERTD_ApiVersion(&major, NULL), EXPERTD_ERROR_INVALID_ARGUMENT);
}

static void test_errors(void) {
  EXPERTD_Error* e = EXPERTD_ErrorNew(EXPERTD_ERROR_NOT_FOUND, "no such model");
  REQUIRE(e != NULL, "EXPERTD_ErrorNew returned NULL");
  EXPECT(EXPERTD_ErrorCode(e) == EXPERTD_ERROR_NOT_FOUND, "code %d", (int)EXPERTD_ErrorCode(e));
  EXPECT(strcmp(EXPERTD_ErrorCodeString(e), "NOT_FOUND") == 0, "%s", EXPERTD_ErrorCodeString(e));
  EXPECT(strcmp(EXPERTD_ErrorMessage(e), "no such model") == 0, "%s", EXPERTD_ErrorMessage(e));
  EXPERTD_ErrorDelete(e);

  /* Codes keep the gRPC numbers. */
  EXPECT(EXPERTD_ERROR_INVALID_ARGUMENT == 3 && EXPERTD_ERROR_UNAVAILABLE == 14 &&
             EXPERTD_ERROR_INTERNAL == 13 && EXPERTD_ERROR_UNAUTHENTICATED == 16,
         "code numbers differ from gRPC's");

  e = EXPERTD_ErrorNew((EXPERTD_Error_Code)99, NULL);
  EXPECT(EXPERTD_ErrorCode(e) == EXPERTD_ERROR_UNKNOWN, "code %d", (int)EXPERTD_ErrorCode(e));
  EXPECT(strcmp(EXPERTD_ErrorMessage(e), "") == 0, "message '%s'", EXPERTD_ErrorMessage(e));
  EXPECT(strcmp(EXPERTD_ErrorCodeString(e), "UNKNOWN") == 0, "%s", EXPERTD_ErrorCodeString(e));
  EXPERTD_ErrorDelete(e);

  e = EXPERTD_ErrorNew(EXPERTD_ERROR_UNAUTHENTICATED, "x");
  EXPECT(strcmp(EXPERTD_ErrorCodeString(e), "UNAUTHENTICATED") == 0, "%s",
         EXPERTD_ErrorCodeString(e));
  EXPERTD_ErrorDelete(e);

  /* NULL is "no error". */
  EXPERTD_ErrorDelete(NULL);
  EXPECT(strcmp(EXPERTD_ErrorMessage(NULL), "") == 0, "message of NULL");
  EXPECT(strcmp(EXPERTD_ErrorCodeString(NULL), "OK") == 0, "code string of NULL");
  EXPECT(EXPERTD_ErrorCode(NULL) == EXPERTD_ERROR_INVALID_ARGUMENT, "code of NULL");
}

static void test_null_arguments(void) {
  EXPERTD_Client* client = (EXPERTD_Client*)0x1; /* must stay untouched on errors */
  EXPERTD_Session* session = NULL;
  EXPERTD_Lease* lease = NULL;
  uint32_t u32 = 0, experts[2] = {0, 1};
  uint64_t u64 = 0;
  size_t n = 0;
  bool b = false;
  const char* str = NULL;
  const void* ptr = NULL;
  const uint32_t* layers = NULL;

  EXPERTD_Error* e = EXPERTD_ClientNew(NULL, "unix:///nowhere", NULL);
  EXPECT(e != NULL && EXPERTD_ErrorCode(e) == EXPERTD_ERROR_INVALID_ARGUMENT &&
             strstr(EXPERTD_ErrorMessage(e), "'client'") != NULL,
         "the message names the argument: %s", EXPERTD_ErrorMessage(e));
  EXPERTD_ErrorDelete(e);
  EXPECT_CODE(EXPERTD_ClientNew(&client, NULL, NULL), EXPERTD_ERROR_INVALID_ARGUMENT);
  EXPECT(client == (EXPERTD_Client*)0x1, "the output was written on an error");
  EXPECT_CODE(EXPERTD_ClientNew(&client, "", NULL), EXPERTD_ERROR_INVALID_ARGUMENT);
  EXPECT_CODE(EXPERTD_ClientNewWithTimeout(&client, "/nowhere", NULL, 0),
              EXPERTD_ERROR_INVALID_ARGUMENT);
  EXPECT(client == (EXPERTD_Client*)0x1, "the output was written on an error");

  EXPECT_CODE(EXPERTD_ClientHealth(NULL, NULL, &b), EXPERTD_ERROR_INVALID_ARGUMENT);
  EXPECT_CODE(EXPERTD_ClientListModels(NULL, &n), EXPERTD_ERROR_INVALID_ARGUMENT);
  EXPECT_CODE(EXPERTD_ClientModelName(NULL, 0, &str), EXPERTD_ERROR_INVALID_ARGUMENT);
  EXPECT_CODE(EXPERTD_ClientModelArchitecture(NULL, 0, &str), EXPERTD_ERROR_INVALID_ARGUMENT);
  EXPECT_CODE(EXPERTD_ClientModelExperts(NULL, 0, &u32, &u32), EXPERTD_ERROR_INVALID_ARGUMENT);
  EXPECT_CODE(EXPERTD_ClientModelMoeLayers(NULL, 0, &layers, &n), EXPERTD_ERROR_INVALID_ARGUMENT);
  EXPECT_CODE(EXPERTD_ClientModelExpertBytes(NULL, 0, &u64), EXPERTD_ERROR_INVALID_ARGUMENT);

  EXPECT_CODE(EXPERTD_SessionNew(&session, NULL, "demo", NULL), EXPERTD_ERROR_INVALID_ARGUMENT);
  EXPECT_CODE(EXPERTD_SessionNew(NULL, NULL, "demo", NULL), EXPERTD_ERROR_INVALID_ARGUMENT);
  EXPECT(session == NULL, "the output was written on an error");
  EXPECT_CODE(EXPERTD_SessionDevice(NULL, &str, &str), EXPERTD_ERROR_INVALID_ARGUMENT);
  EXPECT_CODE(EXPERTD_SessionCudaDevice(NULL, &(int){0}), EXPERTD_ERROR_INVALID_ARGUMENT);
  EXPECT_CODE(EXPERTD_SessionLimits(NULL, &u32, &u32, &u64), EXPERTD_ERROR_INVALID_ARGUMENT);
  EXPECT_CODE(EXPERTD_SessionExperts(NULL, &u32, &u32), EXPERTD_ERROR_INVALID_ARGUMENT);
  EXPECT_CODE(EXPERTD_SessionMoeLayers(NULL, &layers, &n), EXPERTD_ERROR_INVALID_ARGUMENT);
  EXPECT_CODE(EXPERTD_SessionSlotClassCount(NULL, &u32), EXPERTD_ERROR_INVALID_ARGUMENT);
  EXPECT_CODE(EXPERTD_SessionLayerSlotClass(NULL, 0, &u32), EXPERTD_ERROR_INVALID_ARGUMENT);
  EXPECT_CODE(EXPERTD_SessionProjectionCount(NULL, 0, &u32), EXPERTD_ERROR_INVALID_ARGUMENT);
  EXPECT_CODE(EXPERTD_SessionProjection(NULL, 0, 0, &str, &str, &u32, &u64, &u64, &u64),
              EXPERTD_ERROR_INVALID_ARGUMENT);
  EXPECT_CODE(EXPERTD_SessionArena(NULL, 0, 0, &ptr, &u64, &u32), EXPERTD_ERROR_INVALID_ARGUMENT);
  EXPECT_CODE(EXPERTD_SessionAcquire(NULL, 0, experts, 2, 1000, &lease),
              EXPERTD_ERROR_INVALID_ARGUMENT);
  EXPECT(lease == NULL, "the output was written on an error");
  EXPECT_CODE(EXPERTD_SessionPrefetch(NULL, 0, experts, 2), EXPERTD_ERROR_INVALID_ARGUMENT);
  EXPECT_CODE(EXPERTD_SessionRelease(NULL, NULL), EXPERTD_ERROR_INVALID_ARGUMENT);
  EXPECT_CODE(EXPERTD_SessionReleaseLater(NULL, NULL), EXPERTD_ERROR_INVALID_ARGUMENT);
  EXPECT_CODE(EXPERTD_SessionFlush(NULL), EXPERTD_ERROR_INVALID_ARGUMENT);
  EXPECT_CODE(EXPERTD_SessionWaitReady(NULL, NULL, NULL), EXPERTD_ERROR_INVALID_ARGUMENT);
  EXPECT_CODE(EXPERTD_SessionWaitReadyOnHost(NULL, NULL), EXPERTD_ERROR_INVALID_ARGUMENT);
  EXPECT_CODE(EXPERTD_SessionRecordDone(NULL, NULL, NULL), EXPERTD_ERROR_INVALID_ARGUMENT);
  EXPECT_CODE(EXPERTD_SessionPollErrors(NULL), EXPERTD_ERROR_INVALID_ARGUMENT);
  EXPECT_CODE(EXPERTD_LeaseInfo(NULL, &u64, &u32, &u64), EXPERTD_ERROR_INVALID_ARGUMENT);
  EXPECT_CODE(EXPERTD_LeaseSlotCount(NULL, &n), EXPERTD_ERROR_INVALID_ARGUMENT);
  EXPECT_CODE(EXPERTD_LeaseSlot(NULL, 0, &u32, &u32, &u32, &b), EXPERTD_ERROR_INVALID_ARGUMENT);
  EXPECT_CODE(EXPERTD_LeaseProjection(NULL, 0, 0, &ptr, &u64), EXPERTD_ERROR_INVALID_ARGUMENT);

  /* Deleting NULL is a no-op, as free(NULL). */
  EXPECT(EXPERTD_ClientDelete(NULL) == NULL, "EXPERTD_ClientDelete(NULL)");
  EXPECT(EXPERTD_SessionDelete(NULL) == NULL, "EXPERTD_SessionDelete(NULL)");
  EXPECT(EXPERTD_LeaseDelete(NULL) == NULL, "EXPERTD_LeaseDelete(NULL)");
}

static void test_unreachable(void) {
  char path[512];
  snprintf(path, sizeof path, "/tmp/expertd-c-api-test-%ld/no-such.sock", (long)getpid());
  EXPERTD_Client* client = NULL;

  /* A plain path, with the default 5 s connect timeout. */
  double t0 = now_s();
  EXPERTD_Error* e = EXPERTD_ClientNew(&client, path, NULL);
  REQUIRE(e != NULL, "connecting to %s succeeded", path);
  EXPECT(EXPERTD_ErrorCode(e) == EXPERTD_ERROR_UNAVAILABLE, "code %s: %s",
         EXPERTD_ErrorCodeString(e), EXPERTD_ErrorMessage(e));
  EXPECT(strstr(EXPERTD_ErrorMessage(e), path) != NULL, "the message names the address: %s",
         EXPERTD_ErrorMessage(e));
  printf("  ok: %s -> %s: %s (%.1f s)\n", path, EXPERTD_ErrorCodeString(e), EXPERTD_ErrorMessage(e),
         now_s() - t0);
  EXPERTD_ErrorDelete(e);
  EXPECT(client == NULL, "the output was written on an error");

  /* A unix:// URL with a short timeout. */
  char url[600];
  snprintf(url, sizeof url, "unix://%s", path);
  t0 = now_s();
  e = EXPERTD_ClientNewWithTimeout(&client, url, "token", 300);
  const double waited = now_s() - t0;
  REQUIRE(e != NULL, "connecting to %s succeeded", url);
  EXPECT(EXPERTD_ErrorCode(e) == EXPERTD_ERROR_UNAVAILABLE, "code %s: %s",
         EXPERTD_ErrorCodeString(e), EXPERTD_ErrorMessage(e));
  EXPECT(EXPERTD_ErrorMessage(e)[0] != '\0', "empty message");
  EXPECT(waited < 4.0, "a 300 ms connect timeout took %.1f s", waited);
  EXPERTD_ErrorDelete(e);
}

/* ---- The oracle: the model file's tensor offsets ------------------------------------------ */

enum { kMaxTensors = 4096, kMaxName = 128 };

struct gguf_tensor {
  char name[kMaxName];
  uint64_t offset; /* absolute, in the file */
};

static struct {
  int fd;
  uint64_t n;
  struct gguf_tensor t[kMaxTensors];
} gguf; /* filled by gguf_open */

/* Opens `path` and reads its tensor offsets from tests/support/gguf_tensors.py --offsets, a GGUF
 * reader independent of the project's. Returns 0 on success. */
static int gguf_open(const char* path) {
  gguf.fd = open(path, O_RDONLY);
  if (gguf.fd < 0) return -1;
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "python3 '%s/tests/support/gguf_tensors.py' --offsets '%s'",
           EXPERTD_SOURCE_DIR, path);
  FILE* p = popen(cmd, "r");
  if (p == NULL) return -1;
  char name[kMaxName];
  unsigned long long offset = 0;
  while (gguf.n < kMaxTensors && fscanf(p, "%127s %llu", name, &offset) == 2) {
    memcpy(gguf.t[gguf.n].name, name, sizeof name);
    gguf.t[gguf.n].offset = offset;
    ++gguf.n;
  }
  return pclose(p) == 0 && gguf.n > 0 ? 0 : -1;
}

/* Compares `bytes` granted bytes of `expert` with the stacked tensor blk.LAYER.ffn_KIND_exps
 * in the file; each expert's part of it is `bytes` long. */
static void expect_gguf_bytes(uint32_t layer, const char* kind, uint32_t expert, const void* data,
                              uint64_t bytes) {
  char name[kMaxName];
  snprintf(name, sizeof name, "blk.%u.ffn_%s_exps.weight", layer, kind);
  const struct gguf_tensor* t = NULL;
  for (uint64_t i = 0; i < gguf.n; ++i) {
    if (strcmp(gguf.t[i].name, name) == 0) t = &gguf.t[i];
  }
  if (t == NULL) {
    EXPECT(0, "no tensor %s in the model file", name);
    return;
  }
  unsigned char* want = malloc(bytes);
  REQUIRE(want != NULL, "malloc");
  const ssize_t got = pread(gguf.fd, want, bytes, (off_t)(t->offset + expert * bytes));
  EXPECT(got == (ssize_t)bytes && memcmp(want, data, bytes) == 0,
         "layer %u expert %u %s: granted bytes differ from the model file", layer, expert, kind);
  free(want);
}

/* ---- Against a daemon ------------------------------------------------------------------------ */

static void start_daemon(const char* expertd, const char* socket_path) {
  char cfg[512];
  snprintf(cfg, sizeof cfg, "%s/expertd.toml", work_dir);
  FILE* f = fopen(cfg, "w");
  REQUIRE(f != NULL, "cannot write %s: %s", cfg, strerror(errno));
  /* The host device, so the test means the same with or without a GPU. */
  fputs("[device]\nkind = \"host\"\n", f);
  fclose(f);
  REQUIRE(setenv("XDG_CACHE_HOME", work_dir, 1) == 0, "setenv");
  char* argv[] = {(char*)expertd,     "--demo",      "--config", cfg, "--socket",
                  (char*)socket_path, "--log-level", "warn",     NULL};
  const int rc = posix_spawn(&daemon_pid, expertd, NULL, NULL, argv, environ);
  REQUIRE(rc == 0, "cannot start %s: %s", expertd, strerror(rc));
  printf("started %s (pid %ld) on %s\n", expertd, (long)daemon_pid, socket_path);
}

static EXPERTD_Client* connect_when_serving(const char* socket_path) {
  const double deadline = now_s() + 120.0;
  for (;;) {
    int status = 0;
    REQUIRE(waitpid(daemon_pid, &status, WNOHANG) == 0, "the daemon exited during start-up (%d)",
            status);
    EXPERTD_Client* client = NULL;
    EXPERTD_Error* e = EXPERTD_ClientNewWithTimeout(&client, socket_path, NULL, 500);
    if (e == NULL) {
      bool serving = false;
      e = EXPERTD_ClientHealth(client, NULL, &serving);
      if (e == NULL && serving) return client;
      EXPERTD_ClientDelete(client);
    }
    REQUIRE(now_s() < deadline, "the daemon did not serve within 120 s: %s",
            e ? EXPERTD_ErrorMessage(e) : "NOT_SERVING");
    EXPERTD_ErrorDelete(e);
    sleep_ms(100);
  }
}

static void stop_daemon(void) {
  REQUIRE(kill(daemon_pid, SIGTERM) == 0, "kill: %s", strerror(errno));
  const double deadline = now_s() + 60.0;
  int status = 0;
  pid_t r;
  while ((r = waitpid(daemon_pid, &status, WNOHANG)) == 0) {
    REQUIRE(now_s() < deadline, "the daemon did not stop within 60 s of SIGTERM");
    sleep_ms(50);
  }
  daemon_pid = -1;
  REQUIRE(r > 0, "waitpid: %s", strerror(errno));
  EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0,
         "the daemon ended with status 0x%x after SIGTERM", status);
}

static bool all_zero(const unsigned char* p, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) {
    if (p[i] != 0) return false;
  }
  return true;
}

enum { kMaxProjections = 8 };

/* Checks a lease of `n` experts of a layer: order, slot ranges, pointer arithmetic. */
static void check_lease(EXPERTD_Session* s, EXPERTD_Lease* lease, uint32_t layer,
                        const uint32_t* experts, size_t n, uint32_t n_proj) {
  size_t count = 0;
  OK(EXPERTD_LeaseSlotCount(lease, &count));
  REQUIRE(count == n, "lease has %zu slots for %zu experts", count, n);
  uint32_t lease_layer = 0;
  uint64_t id = 0;
  OK(EXPERTD_LeaseInfo(lease, &id, &lease_layer, NULL));
  EXPECT(lease_layer == layer, "lease layer %u, asked %u", lease_layer, layer);
  EXPECT(id != 0, "lease id 0");
  for (size_t i = 0; i < n; ++i) {
    uint32_t expert = 0, cls = 0, slot = 0;
    bool hit = false;
    OK(EXPERTD_LeaseSlot(lease, i, &expert, &cls, &slot, &hit));
    EXPECT(expert == experts[i], "slot %zu holds expert %u, asked %u", i, expert, experts[i]);
    for (uint32_t p = 0; p < n_proj; ++p) {
      const void* base = NULL;
      uint64_t stride = 0;
      uint32_t n_slots = 0;
      OK(EXPERTD_SessionArena(s, cls, p, &base, &stride, &n_slots));
      EXPECT(slot < n_slots, "slot %u of %u", slot, n_slots);
      const void* data = NULL;
      uint64_t bytes = 0;
      OK(EXPERTD_LeaseProjection(lease, i, p, &data, &bytes));
      REQUIRE(data != NULL, "projection %u of slot %zu is NULL", p, i);
      EXPECT(bytes == stride, "projection %u: %llu bytes, stride %llu", p,
             (unsigned long long)bytes, (unsigned long long)stride);
      EXPECT((const unsigned char*)data == (const unsigned char*)base + (uint64_t)slot * stride,
             "projection %u of slot %u is not at base + slot * stride", p, slot);
      EXPECT(!all_zero(data, bytes), "expert %u projection %u is all zero", expert, p);
      const char* kind = NULL;
      const char* type = NULL;
      uint32_t type_id = 0;
      uint64_t ne0 = 0, ne1 = 0, eb = 0;
      OK(EXPERTD_SessionProjection(s, cls, p, &kind, &type, &type_id, &ne0, &ne1, &eb));
      expect_gguf_bytes(layer, kind, expert, data, bytes);
    }
    EXPECT_CODE(EXPERTD_LeaseProjection(lease, i, n_proj, &(const void*){NULL}, &(uint64_t){0}),
                EXPERTD_ERROR_INVALID_ARGUMENT);
  }
  EXPECT_CODE(EXPERTD_LeaseSlot(lease, n, NULL, NULL, NULL, NULL), EXPERTD_ERROR_INVALID_ARGUMENT);
}

static void test_daemon(const char* expertd) {
  snprintf(work_dir, sizeof work_dir, "/tmp/expertd-c-api-XXXXXX");
  REQUIRE(mkdtemp(work_dir) != NULL, "mkdtemp: %s", strerror(errno));
  char socket_path[300];
  snprintf(socket_path, sizeof socket_path, "%s/expertd.sock", work_dir);
  start_daemon(expertd, socket_path);
  EXPERTD_Client* client = connect_when_serving(socket_path);
  char model_path[400];
  snprintf(model_path, sizeof model_path, "%s/expertd/demo/model.gguf", work_dir);
  REQUIRE(gguf_open(model_path) == 0, "cannot read the tensors of %s", model_path);
  printf("oracle: %" PRIu64 " tensors in %s\n", gguf.n, model_path);

  /* Models. */
  size_t n_models = 0;
  EXPECT_CODE(EXPERTD_ClientModelName(client, 0, &(const char*){NULL}),
              EXPERTD_ERROR_INVALID_ARGUMENT); /* before the first list */
  OK(EXPERTD_ClientListModels(client, &n_models));
  REQUIRE(n_models == 1, "%zu models", n_models);
  const char* name = NULL;
  const char* arch = NULL;
  uint32_t n_expert = 0, n_used = 0;
  const uint32_t* model_layers = NULL;
  size_t n_model_layers = 0;
  uint64_t expert_bytes_total = 0;
  OK(EXPERTD_ClientModelName(client, 0, &name));
  OK(EXPERTD_ClientModelArchitecture(client, 0, &arch));
  OK(EXPERTD_ClientModelExperts(client, 0, &n_expert, &n_used));
  OK(EXPERTD_ClientModelMoeLayers(client, 0, &model_layers, &n_model_layers));
  OK(EXPERTD_ClientModelExpertBytes(client, 0, &expert_bytes_total));
  printf("model '%s' (%s): %u experts, top-%u, %zu MoE layers, %llu expert bytes\n", name, arch,
         n_expert, n_used, n_model_layers, (unsigned long long)expert_bytes_total);
  EXPECT(strcmp(name, "demo") == 0, "model name '%s'", name);
  EXPECT(n_expert == 8 && n_used == 2, "mixtral-tiny is 8 experts top-2, got %u/%u", n_expert,
         n_used);
  REQUIRE(n_model_layers > 0 && model_layers != NULL, "no MoE layers");
  EXPECT(model_layers[0] == 0, "first MoE layer %u", model_layers[0]);
  EXPECT(expert_bytes_total > 0, "no expert bytes");
  EXPECT_CODE(EXPERTD_ClientModelName(client, 1, &name), EXPERTD_ERROR_INVALID_ARGUMENT);

  bool serving = false;
  OK(EXPERTD_ClientHealth(client, "demo", &serving));
  EXPECT(serving, "model demo is not SERVING");
  EXPECT_CODE(EXPERTD_ClientHealth(client, "no-such-model", &serving), EXPERTD_ERROR_NOT_FOUND);

  /* Sessions. */
  EXPERTD_Session* s1 = NULL;
  EXPERTD_Session* s2 = NULL;
  EXPECT_CODE(EXPERTD_SessionNew(&s1, client, "no-such-model", NULL), EXPERTD_ERROR_NOT_FOUND);
  OK(EXPERTD_SessionNew(&s1, client, "demo", "c-api-test-1"));
  /* The second session keeps everything on the stream; both are checked the same way below. */
  EXPECT_CODE(EXPERTD_SessionNewWithTransport(&s2, client, "demo", NULL, "pigeon"),
              EXPERTD_ERROR_INVALID_ARGUMENT);
  OK(EXPERTD_SessionNewWithTransport(&s2, client, "demo", NULL, "stream"));
  const char* via1 = NULL;
  const char* via2 = NULL;
  OK(EXPERTD_SessionTransport(s1, &via1));
  OK(EXPERTD_SessionTransport(s2, &via2));
  EXPECT(strcmp(via1, "lane") == 0, "default session transport %s, want lane", via1);
  EXPECT(strcmp(via2, "stream") == 0, "stream session transport %s", via2);

  const char* device = NULL;
  const char* kind = NULL;
  OK(EXPERTD_SessionDevice(s1, &device, &kind));
  EXPECT(strcmp(kind, "host") == 0, "device kind %s", kind);
  int ordinal = 7;
  OK(EXPERTD_SessionCudaDevice(s1, &ordinal));
  EXPECT(ordinal == -1, "a host session's CUDA ordinal is %d", ordinal);
  uint32_t max_leases = 0, max_per_acquire = 0;
  uint64_t ttl_ms = 0;
  OK(EXPERTD_SessionLimits(s1, &max_leases, &max_per_acquire, &ttl_ms));
  EXPECT(max_leases > 0 && max_per_acquire >= 2, "limits %u leases, %u experts per acquire",
         max_leases, max_per_acquire);
  uint32_t se = 0, su = 0;
  OK(EXPERTD_SessionExperts(s1, &se, &su));
  EXPECT(se == n_expert && su == n_used, "session says %u/%u", se, su);
  const uint32_t* layers = NULL;
  size_t n_layers = 0;
  OK(EXPERTD_SessionMoeLayers(s1, NULL, &n_layers));
  OK(EXPERTD_SessionMoeLayers(s1, &layers, &n_layers));
  EXPECT(n_layers == n_model_layers, "%zu MoE layers, ListModels said %zu", n_layers,
         n_model_layers);
  uint32_t n_classes = 0;
  OK(EXPERTD_SessionSlotClassCount(s1, &n_classes));
  EXPECT(n_classes >= 1, "no slot classes");

  const uint32_t layer = layers[0];
  uint32_t cls = 0, n_proj = 0;
  OK(EXPERTD_SessionLayerSlotClass(s1, layer, &cls));
  EXPECT_CODE(EXPERTD_SessionLayerSlotClass(s1, 100000, &cls), EXPERTD_ERROR_INVALID_ARGUMENT);
  OK(EXPERTD_SessionProjectionCount(s1, cls, &n_proj));
  REQUIRE(n_proj >= 1 && n_proj <= kMaxProjections, "%u projections", n_proj);
  EXPECT_CODE(EXPERTD_SessionProjectionCount(s1, n_classes, &n_proj),
              EXPERTD_ERROR_INVALID_ARGUMENT);
  for (uint32_t p = 0; p < n_proj; ++p) {
    const char* pkind = NULL;
    const char* type = NULL;
    uint32_t type_id = 0;
    uint64_t ne0 = 0, ne1 = 0, eb = 0, stride = 0;
    const void* base = NULL;
    uint32_t n_slots = 0;
    OK(EXPERTD_SessionProjection(s1, cls, p, &pkind, &type, &type_id, &ne0, &ne1, &eb));
    OK(EXPERTD_SessionArena(s1, cls, p, &base, &stride, &n_slots));
    printf("slot class %u projection %u: %s %s [%llu, %llu], %llu bytes; arena %p, %u slots\n", cls,
           p, pkind, type, (unsigned long long)ne0, (unsigned long long)ne1, (unsigned long long)eb,
           base, n_slots);
    EXPECT(eb == stride && eb > 0, "expert bytes %llu, slot stride %llu", (unsigned long long)eb,
           (unsigned long long)stride);
    EXPECT(base != NULL && n_slots >= n_used, "arena %p with %u slots", base, n_slots);
  }
  EXPECT_CODE(
      EXPERTD_SessionArena(s1, cls, n_proj, &(const void*){NULL}, &(uint64_t){0}, &(uint32_t){0}),
      EXPERTD_ERROR_INVALID_ARGUMENT);

  /* Acquire experts [0, 1] and keep a copy of their bytes. */
  const uint32_t e01[2] = {0, 1};
  EXPERTD_Lease* lease1 = NULL;
  OK(EXPERTD_SessionAcquire(s1, layer, e01, 2, 30000, &lease1));
  check_lease(s1, lease1, layer, e01, 2, n_proj);
  unsigned char* copy[2][kMaxProjections] = {{NULL}};
  uint64_t copy_bytes[kMaxProjections] = {0};
  for (size_t i = 0; i < 2; ++i) {
    for (uint32_t p = 0; p < n_proj; ++p) {
      const void* data = NULL;
      OK(EXPERTD_LeaseProjection(lease1, i, p, &data, &copy_bytes[p]));
      copy[i][p] = malloc(copy_bytes[p]);
      REQUIRE(copy[i][p] != NULL, "malloc");
      memcpy(copy[i][p], data, copy_bytes[p]);
    }
  }
  for (uint32_t p = 0; p < n_proj; ++p) {
    EXPECT(memcmp(copy[0][p], copy[1][p], copy_bytes[p]) != 0,
           "experts 0 and 1 have the same bytes in projection %u", p);
  }

  /* The same experts through the other session while the first holds them: same bytes. */
  const uint32_t e10[2] = {1, 0};
  EXPERTD_Lease* lease2 = NULL;
  OK(EXPERTD_SessionAcquire(s2, layer, e10, 2, 30000, &lease2));
  check_lease(s2, lease2, layer, e10, 2, n_proj);
  for (size_t i = 0; i < 2; ++i) {
    for (uint32_t p = 0; p < n_proj; ++p) {
      const void* data = NULL;
      uint64_t bytes = 0;
      OK(EXPERTD_LeaseProjection(lease2, i, p, &data, &bytes));
      EXPECT(bytes == copy_bytes[p] && memcmp(data, copy[1 - i][p], bytes) == 0,
             "session 2's expert %u projection %u differs from session 1's", e10[i], p);
    }
  }
  /* A lease given to the wrong session is refused and stays usable. */
  EXPECT_CODE(EXPERTD_SessionRelease(s1, lease2), EXPERTD_ERROR_INVALID_ARGUMENT);
  EXPECT_CODE(EXPERTD_SessionReleaseLater(s1, lease2), EXPERTD_ERROR_INVALID_ARGUMENT);
  EXPECT_CODE(EXPERTD_SessionWaitReady(s1, lease2, NULL), EXPERTD_ERROR_INVALID_ARGUMENT);
  EXPECT_CODE(EXPERTD_SessionWaitReadyOnHost(s1, lease2), EXPERTD_ERROR_INVALID_ARGUMENT);
  EXPECT_CODE(EXPERTD_SessionRecordDone(s1, lease2, NULL), EXPERTD_ERROR_INVALID_ARGUMENT);
  OK(EXPERTD_LeaseSlotCount(lease2, &(size_t){0}));
  /* Host sessions: waiting for ready is a no-op, recording done signals it; the engine's
   * device-neutral sequence works unchanged. */
  OK(EXPERTD_SessionWaitReady(s2, lease2, NULL));
  OK(EXPERTD_SessionWaitReadyOnHost(s2, lease2));
  OK(EXPERTD_SessionRecordDone(s2, lease2, NULL));
  OK(EXPERTD_SessionRelease(s2, lease2));
  OK(EXPERTD_SessionRelease(s1, lease1));

  /* Bad acquires: the daemon's INVALID_ARGUMENT comes back; the session goes on. */
  const uint32_t bad_expert[1] = {n_expert};
  EXPERTD_Lease* none = NULL;
  EXPECT_CODE(EXPERTD_SessionAcquire(s1, layer, bad_expert, 1, 5000, &none),
              EXPERTD_ERROR_INVALID_ARGUMENT);
  EXPECT_CODE(EXPERTD_SessionAcquire(s1, 100000, e01, 2, 5000, &none),
              EXPERTD_ERROR_INVALID_ARGUMENT);
  EXPECT_CODE(EXPERTD_SessionAcquire(s1, layer, e01, 0, 5000, &none),
              EXPERTD_ERROR_INVALID_ARGUMENT);
  EXPECT_CODE(EXPERTD_SessionAcquire(s1, layer, e01, 2, 0, &none), EXPERTD_ERROR_INVALID_ARGUMENT);
  EXPECT(none == NULL, "a lease came back from a failed acquire");

  /* Prefetch hints for the next layer. */
  if (n_layers > 1) {
    const uint32_t hint[2] = {2, 3};
    OK(EXPERTD_SessionPrefetch(s1, layers[1], hint, 2));
  }
  OK(EXPERTD_SessionPrefetch(s1, layer, NULL, 0));

  /* Walk the other experts of every layer a few times, so the cache (a quarter of the model)
   * has reason to evict experts 0 and 1 of the first layer; then read them again through
   * session 2 (in the order 1, 0): the bytes must be the same, re-read or still resident. The
   * second pass gives its leases back as an engine does layer after layer, without waking the
   * daemon for the releases (each goes with the next acquire; the last with the flush): the
   * evictions need those slots back, so a release that never arrived would stall the sweep. */
  for (int pass = 0; pass < 3; ++pass) {
    for (size_t l = 0; l < n_layers; ++l) {
      for (uint32_t e = l == 0 ? 2 : 0; e + 1 < n_expert; e += 2) {
        const uint32_t pair[2] = {e, e + 1};
        EXPERTD_Lease* lease = NULL;
        OK(EXPERTD_SessionAcquire(s1, layers[l], pair, 2, 30000, &lease));
        OK(pass == 1 ? EXPERTD_SessionReleaseLater(s1, lease) : EXPERTD_SessionRelease(s1, lease));
      }
    }
    if (pass == 1) OK(EXPERTD_SessionFlush(s1));
  }
  OK(EXPERTD_SessionFlush(s1)); /* with nothing unread it still succeeds */
  OK(EXPERTD_SessionAcquire(s2, layer, e10, 2, 30000, &lease2));
  check_lease(s2, lease2, layer, e10, 2, n_proj);
  for (size_t i = 0; i < 2; ++i) {
    bool hit = true;
    OK(EXPERTD_LeaseSlot(lease2, i, NULL, NULL, NULL, &hit));
    printf("after the sweep: expert %u %s\n", e10[i],
           hit ? "was still resident" : "was read again");
    for (uint32_t p = 0; p < n_proj; ++p) {
      const void* data = NULL;
      uint64_t bytes = 0;
      OK(EXPERTD_LeaseProjection(lease2, i, p, &data, &bytes));
      EXPECT(bytes == copy_bytes[p] && memcmp(data, copy[1 - i][p], bytes) == 0,
             "expert %u projection %u changed after the sweep", e10[i], p);
    }
  }
  /* EXPERTD_LeaseDelete releases too. */
  OK(EXPERTD_LeaseDelete(lease2));
  EXPERTD_Error* polled = EXPERTD_SessionPollErrors(s1);
  EXPECT(polled == NULL, "session 1 has async errors: %s", EXPERTD_ErrorMessage(polled));
  EXPERTD_ErrorDelete(polled);
  polled = EXPERTD_SessionPollErrors(s2);
  EXPECT(polled == NULL, "session 2 has async errors: %s", EXPERTD_ErrorMessage(polled));
  EXPERTD_ErrorDelete(polled);

  /* A lease that outlives its session is only freed. */
  OK(EXPERTD_SessionAcquire(s2, layer, e01, 2, 30000, &lease2));
  OK(EXPERTD_SessionDelete(s2));
  OK(EXPERTD_LeaseDelete(lease2));

  /* The client may go before its sessions. */
  OK(EXPERTD_ClientDelete(client));
  OK(EXPERTD_SessionAcquire(s1, layer, e01, 2, 30000, &lease1));
  OK(EXPERTD_SessionRelease(s1, lease1));
  OK(EXPERTD_SessionDelete(s1));

  for (size_t i = 0; i < 2; ++i) {
    for (uint32_t p = 0; p < n_proj; ++p) free(copy[i][p]);
  }
  stop_daemon();
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", work_dir);
  if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", work_dir);
}

int main(int argc, char** argv) {
  if (argc == 3 && strcmp(argv[1], "--daemon") == 0) {
    struct stat st;
    REQUIRE(stat(argv[2], &st) == 0, "no daemon binary at %s", argv[2]);
    test_daemon(argv[2]);
  } else if (argc == 1) {
    test_version();
    test_errors();
    test_null_arguments();
    test_unreachable();
  } else {
    fprintf(stderr, "usage: %s [--daemon PATH_TO_EXPERTD]\n", argv[0]);
    return 2;
  }
  if (failures > 0) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  printf("all checks passed\n");
  return 0;
}
