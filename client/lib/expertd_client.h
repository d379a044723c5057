/* The C API of the expertd client library, for inference engines written in C or behind a C
 * FFI. It wraps the C++ client (client.h) and follows the conventions of Triton's
 * tritonserver.h:
 *
 *  - Objects are opaque handles with a prefix: EXPERTD_Client (one connection to the daemon),
 *    EXPERTD_Session (one attachment to one model), EXPERTD_Lease (slots held for one acquire),
 *    EXPERTD_Error.
 *  - Every function returns an EXPERTD_Error*: NULL means success. A non-NULL error belongs to
 *    the caller, who frees it with EXPERTD_ErrorDelete. The only exceptions are the EXPERTD_Error*
 *    accessors themselves and EXPERTD_ErrorDelete.
 *  - Output arguments are required (NULL gives an INVALID_ARGUMENT error and changes nothing)
 *    unless their comment says "nullable"; outputs are written only on success.
 *  - Every returned pointer states who owns it and how long it stays valid.
 *  - No C++ exception crosses this boundary: one inside the library becomes an INTERNAL error.
 *  - Error codes are the gRPC / absl status code numbers (EXPERTD_Error_Code). Errors the daemon
 *    sends keep its code and message (docs/protocol.md lists them).
 *
 * The usual flow (docs/integration.md shows it inside a ggml-style scheduler):
 *
 *   EXPERTD_ClientNew(&client, "unix:///run/expertd/expertd.sock", NULL);
 *   EXPERTD_SessionNew(&session, client, "mixtral", "my-engine");
 *   EXPERTD_SessionArena(session, slot_class, projection, &base, &stride, &n_slots);  (once)
 *   per layer:
 *     EXPERTD_SessionAcquire(session, layer, experts, n, 30000, &lease);  (blocks until ready)
 *     EXPERTD_LeaseSlot(lease, i, ...) -> slot index of experts[i]; kernels read
 *       base + slot * stride
 *     EXPERTD_SessionRelease(session, lease);  (signals done, gives the slots back, frees)
 *   EXPERTD_SessionDelete(session); EXPERTD_ClientDelete(client);
 *
 * Pointers into arenas are read-only. With the host device they are addresses in this process
 * (shared memory the daemon exported); with the CUDA device they are device pointers opened once
 * per process from CUDA IPC handles (EXPERTD_SessionDevice says which).
 *
 * Threading: a client's connection and a session's acquire / prefetch / release / poll calls
 * may be used from several threads at once. The client's model-list cache (EXPERTD_ClientListModels
 * and the EXPERTD_ClientModel* accessors) must not be refreshed while another thread reads it.
 * A lease is used by one thread at a time. */
#ifndef EXPERTD_CLIENT_H_
#define EXPERTD_CLIENT_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define EXPERTD_EXPORT __attribute__((visibility("default")))
#else
#define EXPERTD_EXPORT
#endif

/* The version of this API. MINOR grows when functions are added; MAJOR when a function changes
 * or disappears. A caller built against MAJOR.MINOR works with a library of the same MAJOR and a
 * MINOR at least as large (check with EXPERTD_ApiVersion at run time). */
#define EXPERTD_CLIENT_API_VERSION_MAJOR 1
#define EXPERTD_CLIENT_API_VERSION_MINOR 3

typedef struct EXPERTD_Error EXPERTD_Error;
typedef struct EXPERTD_Client EXPERTD_Client;
typedef struct EXPERTD_Session EXPERTD_Session;
typedef struct EXPERTD_Lease EXPERTD_Lease;

/* ---- Errors ------------------------------------------------------------------------------- */

/* The gRPC / absl status code numbers. (Named EXPERTD_Error_Code, as in Triton, because the
 * accessor function is EXPERTD_ErrorCode.) An error object never carries 0 (OK). */
typedef enum EXPERTD_Error_Code {
  EXPERTD_ERROR_CANCELLED = 1,
  EXPERTD_ERROR_UNKNOWN = 2,
  EXPERTD_ERROR_INVALID_ARGUMENT = 3,
  EXPERTD_ERROR_DEADLINE_EXCEEDED = 4,
  EXPERTD_ERROR_NOT_FOUND = 5,
  EXPERTD_ERROR_ALREADY_EXISTS = 6,
  EXPERTD_ERROR_PERMISSION_DENIED = 7,
  EXPERTD_ERROR_RESOURCE_EXHAUSTED = 8,
  EXPERTD_ERROR_FAILED_PRECONDITION = 9,
  EXPERTD_ERROR_ABORTED = 10,
  EXPERTD_ERROR_OUT_OF_RANGE = 11,
  EXPERTD_ERROR_UNIMPLEMENTED = 12,
  EXPERTD_ERROR_INTERNAL = 13,
  EXPERTD_ERROR_UNAVAILABLE = 14,
  EXPERTD_ERROR_DATA_LOSS = 15,
  EXPERTD_ERROR_UNAUTHENTICATED = 16
} EXPERTD_Error_Code;

/* A new error object, owned by the caller (free with EXPERTD_ErrorDelete). For callbacks and
 * tests; `message` is copied and may be NULL (empty message). A code outside 1..16 becomes
 * UNKNOWN. Never NULL: when memory is exhausted a static RESOURCE_EXHAUSTED "out of memory"
 * error is returned, which EXPERTD_ErrorDelete accepts (and ignores) like any other. */
EXPERTD_EXPORT EXPERTD_Error* EXPERTD_ErrorNew(EXPERTD_Error_Code code, const char* message);

/* Frees an error. NULL is accepted and ignored. */
EXPERTD_EXPORT void EXPERTD_ErrorDelete(EXPERTD_Error* error);

/* The error's code; EXPERTD_ERROR_INVALID_ARGUMENT for NULL. */
EXPERTD_EXPORT EXPERTD_Error_Code EXPERTD_ErrorCode(const EXPERTD_Error* error);

/* The code's name ("UNAVAILABLE", ...). Static storage: valid forever, never freed. "OK" for
 * NULL (no error). */
EXPERTD_EXPORT const char* EXPERTD_ErrorCodeString(const EXPERTD_Error* error);

/* The message, NUL-terminated. Owned by the error: valid until EXPERTD_ErrorDelete(error).
 * "" for NULL. */
EXPERTD_EXPORT const char* EXPERTD_ErrorMessage(const EXPERTD_Error* error);

/* ---- Version ------------------------------------------------------------------------------ */

/* The API version this library implements (EXPERTD_CLIENT_API_VERSION_* it was built with). */
EXPERTD_EXPORT EXPERTD_Error* EXPERTD_ApiVersion(uint32_t* major, uint32_t* minor);

/* ---- Client: one connection to the daemon -------------------------------------------------- */

/* Connects to the daemon at `address`: "unix:///run/expertd/expertd.sock", "unix:/path", a plain
 * absolute socket path, or "HOST:PORT" (TCP: models, health and statistics only; sessions need
 * the Unix socket). `token` is the TCP bearer token, nullable (none). Waits up to 5 s for the
 * connection; UNAVAILABLE when the daemon cannot be reached. On success *client is owned by the
 * caller: free it with EXPERTD_ClientDelete. */
EXPERTD_EXPORT EXPERTD_Error* EXPERTD_ClientNew(EXPERTD_Client** client, const char* address,
                                                const char* token);

/* EXPERTD_ClientNew with a connect timeout in milliseconds (> 0). */
EXPERTD_EXPORT EXPERTD_Error* EXPERTD_ClientNewWithTimeout(EXPERTD_Client** client,
                                                           const char* address, const char* token,
                                                           int64_t connect_timeout_ms);

/* Frees a client and everything it returned (model-list strings and arrays). Sessions opened
 * through it stay usable: each holds its own reference to the connection. NULL is ignored. */
EXPERTD_EXPORT EXPERTD_Error* EXPERTD_ClientDelete(EXPERTD_Client* client);

/* grpc.health.v1 Check of `service`: nullable or "" for the daemon as a whole, or a model name
 * for that model. *serving is true for SERVING, false for NOT_SERVING (e.g. while the daemon
 * drains); transport and RPC failures are errors (NOT_FOUND for a service the daemon does not
 * know). */
EXPERTD_EXPORT EXPERTD_Error* EXPERTD_ClientHealth(EXPERTD_Client* client, const char* service,
                                                   bool* serving);

/* Asks the daemon for its models (ListModels) and caches the answer in the client; *count is
 * the number of models. The accessors below read this cache by index (0 .. count-1; an index
 * past the end is INVALID_ARGUMENT, as is any index before the first call). Every pointer they
 * return is owned by the client and valid until the next EXPERTD_ClientListModels on this
 * client or EXPERTD_ClientDelete, whichever comes first. */
EXPERTD_EXPORT EXPERTD_Error* EXPERTD_ClientListModels(EXPERTD_Client* client, size_t* count);

/* The model's name (what EXPERTD_SessionNew takes) and GGUF architecture ("llama", "deepseek2",
 * "qwen3moe", "gpt-oss", ...). */
EXPERTD_EXPORT EXPERTD_Error* EXPERTD_ClientModelName(EXPERTD_Client* client, size_t index,
                                                      const char** name);
EXPERTD_EXPORT EXPERTD_Error* EXPERTD_ClientModelArchitecture(EXPERTD_Client* client, size_t index,
                                                              const char** architecture);

/* Routed experts per MoE layer and experts the router picks per token. */
EXPERTD_EXPORT EXPERTD_Error* EXPERTD_ClientModelExperts(EXPERTD_Client* client, size_t index,
                                                         uint32_t* n_expert,
                                                         uint32_t* n_expert_used);

/* The block numbers N (of blk.N) of the MoE layers, ascending; *count of them. *layers is an
 * array owned by the client (see EXPERTD_ClientListModels for its lifetime); NULL when count
 * is 0. */
EXPERTD_EXPORT EXPERTD_Error* EXPERTD_ClientModelMoeLayers(EXPERTD_Client* client, size_t index,
                                                           const uint32_t** layers, size_t* count);

/* Bytes of every routed expert of every MoE layer (what a full GPU copy would need). */
EXPERTD_EXPORT EXPERTD_Error* EXPERTD_ClientModelExpertBytes(EXPERTD_Client* client, size_t index,
                                                             uint64_t* bytes);

/* ---- Session: one model, slots leased and read in place ------------------------------------ */

/* Opens a session on `model` (a name from EXPERTD_ClientModelName) on the model's device, maps
 * its arenas and fence tables into this process (a process maps each arena once, for all its
 * sessions), and attaches the session stream. `client_name` (nullable) is shown in the daemon's
 * statistics and logs. Needs the Unix socket (FAILED_PRECONDITION over TCP); NOT_FOUND for an
 * unknown model; RESOURCE_EXHAUSTED when the daemon holds its maximum number of sessions. On
 * success *session is owned by the caller: free it with EXPERTD_SessionDelete. */
EXPERTD_EXPORT EXPERTD_Error* EXPERTD_SessionNew(EXPERTD_Session** session, EXPERTD_Client* client,
                                                 const char* model, const char* client_name);

/* EXPERTD_SessionNew with a choice of where requests travel: "auto" (what EXPERTD_SessionNew
 * does: the session's shared-memory request lane when the daemon offers one, else the stream),
 * "lane" (FAILED_PRECONDITION when the daemon offers none) or "stream" (the gRPC stream for
 * everything). INVALID_ARGUMENT for another string. Since API 1.2. */
EXPERTD_EXPORT EXPERTD_Error* EXPERTD_SessionNewWithTransport(EXPERTD_Session** session,
                                                              EXPERTD_Client* client,
                                                              const char* model,
                                                              const char* client_name,
                                                              const char* transport);

/* Where the session's requests travel: *transport is "lane" or "stream" (a static string). Since
 * API 1.2. */
EXPERTD_EXPORT EXPERTD_Error* EXPERTD_SessionTransport(EXPERTD_Session* session,
                                                       const char** transport);

/* Ends the session: closes its stream, on which the daemon releases every lease still held, and
 * frees the session and everything it returned. Leases of the session that are still alive must
 * no longer be read (their slots may be overwritten); EXPERTD_LeaseDelete then only frees them.
 * NULL is ignored. */
EXPERTD_EXPORT EXPERTD_Error* EXPERTD_SessionDelete(EXPERTD_Session* session);

/* The device the session's arenas live on: *device is its name ("host", "cuda:0") and *kind
 * "host" (pointers are addresses in this process) or "cuda" (device pointers). Owned by the
 * session, valid until EXPERTD_SessionDelete. Either output is nullable. */
EXPERTD_EXPORT EXPERTD_Error* EXPERTD_SessionDevice(EXPERTD_Session* session, const char** device,
                                                    const char** kind);

/* CUDA sessions: *ordinal is this process's CUDA device ordinal of the daemon's GPU (found by its
 * UUID, so it may differ from the number in the daemon's device name when the two processes see
 * different CUDA_VISIBLE_DEVICES): the device of the arena pointers, of the streams passed to
 * EXPERTD_SessionWaitReady / EXPERTD_SessionRecordDone. -1 for host sessions. Since API 1.3. */
EXPERTD_EXPORT EXPERTD_Error* EXPERTD_SessionCudaDevice(EXPERTD_Session* session, int* ordinal);

/* The daemon's limits for this session; each output nullable. An acquire of more experts than
 * *max_experts_per_acquire, or while *max_leases are held, fails; a lease held longer than
 * *lease_ttl_ms is reclaimed by the daemon (reported by EXPERTD_SessionPollErrors). */
EXPERTD_EXPORT EXPERTD_Error* EXPERTD_SessionLimits(EXPERTD_Session* session, uint32_t* max_leases,
                                                    uint32_t* max_experts_per_acquire,
                                                    uint64_t* lease_ttl_ms);

/* Routed experts per MoE layer and experts picked per token. */
EXPERTD_EXPORT EXPERTD_Error* EXPERTD_SessionExperts(EXPERTD_Session* session, uint32_t* n_expert,
                                                     uint32_t* n_expert_used);

/* The MoE layers: *count of them, and *layers (nullable: pass NULL for the count only) their
 * block numbers N of blk.N, ascending: the `layer` argument of acquire and prefetch. The array
 * is owned by the session, valid until EXPERTD_SessionDelete. The protocol describes MoE layers
 * only; dense blocks are not counted. */
EXPERTD_EXPORT EXPERTD_Error* EXPERTD_SessionMoeLayers(EXPERTD_Session* session,
                                                       const uint32_t** layers, size_t* count);

/* Slot classes: layers whose expert bundles share one layout share one set of arenas. */
EXPERTD_EXPORT EXPERTD_Error* EXPERTD_SessionSlotClassCount(EXPERTD_Session* session,
                                                            uint32_t* count);

/* The slot class of MoE layer `layer` (block number); INVALID_ARGUMENT when it is not an MoE
 * layer of the model. */
EXPERTD_EXPORT EXPERTD_Error* EXPERTD_SessionLayerSlotClass(EXPERTD_Session* session,
                                                            uint32_t layer, uint32_t* slot_class);

/* The projections of a slot class, in bundle order: projection p (0 .. count-1) is the p
 * argument of EXPERTD_SessionProjection, EXPERTD_SessionArena and EXPERTD_LeaseProjection. */
EXPERTD_EXPORT EXPERTD_Error* EXPERTD_SessionProjectionCount(EXPERTD_Session* session,
                                                             uint32_t slot_class, uint32_t* count);

/* One projection of a slot class. Each output is nullable.
 *   kind:         "gate", "up", "gate_up", "down", "gate_bias", "up_bias", "gate_up_bias",
 *                 "down_bias"
 *   type_name:    ggml type name ("q4_K", "mxfp4", "f32", ...); type_id its ggml type number
 *   ne0, ne1:     one expert is an [ne0, ne1] matrix (ne1 = 1 for biases)
 *   expert_bytes: bytes of one expert = the arena's slot stride
 * Strings are owned by the session, valid until EXPERTD_SessionDelete. INVALID_ARGUMENT for a
 * class or projection out of range. */
EXPERTD_EXPORT EXPERTD_Error* EXPERTD_SessionProjection(EXPERTD_Session* session,
                                                        uint32_t slot_class, uint32_t projection,
                                                        const char** kind, const char** type_name,
                                                        uint32_t* type_id, uint64_t* ne0,
                                                        uint64_t* ne1, uint64_t* expert_bytes);

/* The arena of (slot class, projection): slot s holds that projection of the expert granted in
 * it at [*base + s * *slot_stride, *base + (s + 1) * *slot_stride), for s < *slot_count. An
 * engine points a stacked expert tensor at it once: data = base, ne[2] = slot_count,
 * nb[2] = slot_stride; after an acquire, router ids remapped to slot indexes select the experts.
 * The bytes after the last slot, up to the mapping's end, are zero padding (at least 64 KiB), so
 * kernels that read a little past a row stay inside the mapping. *base is read-only, owned by the session, valid
 * until EXPERTD_SessionDelete; a slot's bytes are meaningful only while a lease holds it. */
EXPERTD_EXPORT EXPERTD_Error* EXPERTD_SessionArena(EXPERTD_Session* session, uint32_t slot_class,
                                                   uint32_t projection, const void** base,
                                                   uint64_t* slot_stride, uint32_t* slot_count);

/* Leases one slot for each of the `n` experts (0 .. n_expert-1) of MoE layer `layer` and returns
 * when every slot is ready to read. Pass each expert once (the unique router ids). Waits up to
 * `timeout_ms` (> 0) in all, retrying while every slot is leased by someone (the daemon answers
 * UNAVAILABLE then): DEADLINE_EXCEEDED after it. INVALID_ARGUMENT for n == 0, too many experts,
 * a layer that is not an MoE layer or an expert out of range; RESOURCE_EXHAUSTED when the
 * session already holds its maximum of leases; UNAVAILABLE when the session stream has ended.
 * On success *lease is owned by the caller: give it back with EXPERTD_SessionRelease (or
 * EXPERTD_LeaseDelete). */
EXPERTD_EXPORT EXPERTD_Error* EXPERTD_SessionAcquire(EXPERTD_Session* session, uint32_t layer,
                                                     const uint32_t* experts, size_t n,
                                                     int64_t timeout_ms, EXPERTD_Lease** lease);

/* A hint: these experts of `layer` will probably be acquired soon (most likely first), e.g. the
 * next layer's router applied to the current hidden state. The daemon stages them at low
 * priority; nothing is leased and no answer comes. n == 0 does nothing (experts may be NULL). */
EXPERTD_EXPORT EXPERTD_Error* EXPERTD_SessionPrefetch(EXPERTD_Session* session, uint32_t layer,
                                                      const uint32_t* experts, size_t n);

/* CUDA sessions (kind "cuda" in EXPERTD_SessionDevice): EXPERTD_SessionAcquire returns when the
 * grant arrived, while the copies into the slots may still run on the daemon's stream. Before
 * the kernels that read the lease's slots, make their stream wait for those copies on the GPU
 * (cudaStreamWaitEvent on the slots' IPC ready events; the CPU does not wait). `cuda_stream` is
 * a cudaStream_t; NULL is the legacy default stream. Host sessions: nothing to do (the slots
 * were ready when the acquire returned); returns NULL. Since API 1.1. */
EXPERTD_EXPORT EXPERTD_Error* EXPERTD_SessionWaitReady(EXPERTD_Session* session,
                                                       EXPERTD_Lease* lease, void* cuda_stream);

/* EXPERTD_SessionWaitReady on the CPU: CUDA sessions block the calling thread until the copies
 * into the lease's slots landed (cudaEventSynchronize on their ready events), for engines whose
 * kernels run on streams they cannot pass here; they must queue those kernels after this call
 * returns. Counts as EXPERTD_SessionWaitReady for EXPERTD_SessionRecordDone. Host sessions:
 * nothing to do; returns NULL. Since API 1.3. */
EXPERTD_EXPORT EXPERTD_Error* EXPERTD_SessionWaitReadyOnHost(EXPERTD_Session* session,
                                                             EXPERTD_Lease* lease);

/* CUDA sessions: after the kernels that read the lease's slots were queued on `cuda_stream`,
 * records this session's done event of each slot on it; then release the lease. The daemon's
 * next copy into those slots waits on these records on the GPU. A lease served in this process
 * (a client-side hit, docs/protocol.md) records a private event instead, and its slots stay
 * pinned after the release until that event completed. FAILED_PRECONDITION when
 * EXPERTD_SessionWaitReady was not called for the lease. Host sessions: signals done now (the
 * reads must have returned). Since API 1.1. */
EXPERTD_EXPORT EXPERTD_Error* EXPERTD_SessionRecordDone(EXPERTD_Session* session,
                                                        EXPERTD_Lease* lease, void* cuda_stream);

/* Gives a lease back after this process finished reading its slots: signals done for every slot,
 * sends the release, and frees the lease object. The lease object is freed whether the call
 * succeeds or not (on an error the daemon still reclaims the slots when the session ends or the
 * lease expires); the one exception is an INVALID_ARGUMENT error for a NULL argument or a lease
 * of another session, which changes nothing. After the call the lease's pointers must not be
 * read. Host device: the reads must have returned. CUDA: EXPERTD_SessionRecordDone must have
 * been called for a lease that EXPERTD_SessionWaitReady was called for (kernels may still be
 * running; the records order the daemon's overwrites after them); without it the release fails
 * with FAILED_PRECONDITION, the lease is freed here and the daemon reclaims its slots only when
 * the session ends or the lease TTL passes. A lease never waited for is given back as unread. */
EXPERTD_EXPORT EXPERTD_Error* EXPERTD_SessionRelease(EXPERTD_Session* session,
                                                     EXPERTD_Lease* lease);

/* EXPERTD_SessionRelease without waking the daemon for it: on the request lane the release waits
 * until the daemon next reads the session's lane — with the session's next request (the next
 * layer's acquire), EXPERTD_SessionFlush, or at the end of the lane thread's sleep (2 s at
 * most); its slots stay leased until then. For engines that release every layer's lease and
 * acquire the next layer's soon after: one wake-up of the daemon per layer instead of two.
 * Call EXPERTD_SessionFlush once the engine stops acquiring (the end of a forward pass). Over
 * the gRPC stream the same as EXPERTD_SessionRelease. Since API 1.3. */
EXPERTD_EXPORT EXPERTD_Error* EXPERTD_SessionReleaseLater(EXPERTD_Session* session,
                                                          EXPERTD_Lease* lease);

/* Wakes the daemon for releases EXPERTD_SessionReleaseLater wrote that it has not read yet;
 * nothing when there are none. Since API 1.3. */
EXPERTD_EXPORT EXPERTD_Error* EXPERTD_SessionFlush(EXPERTD_Session* session);

/* Errors the daemon reported for requests nobody waits on (a failed release) and leases it
 * reclaimed because they outlived the lease TTL, since the last call. NULL when there were none;
 * else one error listing them all, with the code of the first failed request, or
 * DEADLINE_EXCEEDED when only reclaimed leases are reported. */
EXPERTD_EXPORT EXPERTD_Error* EXPERTD_SessionPollErrors(EXPERTD_Session* session);

/* ---- Lease: the slots of one acquire ------------------------------------------------------- */

/* The lease's daemon id, its layer and the daemon-side time from request to grant in
 * microseconds (0 for a pure hit). Each output nullable. */
EXPERTD_EXPORT EXPERTD_Error* EXPERTD_LeaseInfo(EXPERTD_Lease* lease, uint64_t* id, uint32_t* layer,
                                                uint64_t* stall_us);

/* Number of slots: one per requested expert, in the order of the acquire's `experts`. */
EXPERTD_EXPORT EXPERTD_Error* EXPERTD_LeaseSlotCount(EXPERTD_Lease* lease, size_t* count);

/* Slot i (0 .. count-1): the expert it holds (experts[i] of the acquire), its slot class, the slot
 * index inside that class's arenas, and whether the expert was resident when requested. Each
 * output nullable. */
EXPERTD_EXPORT EXPERTD_Error* EXPERTD_LeaseSlot(EXPERTD_Lease* lease, size_t i, uint32_t* expert,
                                                uint32_t* slot_class, uint32_t* slot, bool* hit);

/* The bytes of projection p of slot i: *data = arena base + slot * slot stride, *bytes = the
 * slot stride (the projection's expert_bytes). Read-only, owned by the session; valid while the
 * lease is held (until EXPERTD_SessionRelease / EXPERTD_LeaseDelete / EXPERTD_SessionDelete). */
EXPERTD_EXPORT EXPERTD_Error* EXPERTD_LeaseProjection(EXPERTD_Lease* lease, size_t i,
                                                      uint32_t projection, const void** data,
                                                      uint64_t* bytes);

/* Frees a lease, releasing it first exactly as EXPERTD_SessionRelease would when its session is
 * still open (the error returned is then the release's; the lease is freed regardless). When
 * the session has been deleted the daemon released the lease already and it is only freed. NULL
 * is ignored. */
EXPERTD_EXPORT EXPERTD_Error* EXPERTD_LeaseDelete(EXPERTD_Lease* lease);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* EXPERTD_CLIENT_H_ */
