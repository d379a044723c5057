#include "metrics.h"

#include <httplib.h>

#include <sstream>

#include "absl/strings/str_cat.h"

namespace expertd {
namespace {

// Label values escape backslash, quote and newline.
std::string Label(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

void Header(std::ostringstream& out, const char* name, const char* type, const char* help) {
  out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
}

}  // namespace

std::string RenderMetrics(ServiceState& state) {
  std::ostringstream out;
  std::vector<std::shared_ptr<Session>> sessions = state.sessions->Sessions();
  std::lock_guard<std::mutex> lock(state.models_mu);
  struct Row {
    std::string model;  // the label values, escaped: model="<this>" (model and device)
    EngineStats e;
    LatencyHistogram stall;
    std::vector<std::pair<std::string, uint64_t>> packs;
    uint64_t leases = 0;
    uint64_t sessions = 0;
  };
  std::vector<Row> rows;
  for (const auto& [name, on] : state.models) {
    for (ServedModel* model : on) {
      Row r{absl::StrCat(Label(name), "\",device=\"", Label(std::string(model->device_name()))),
            model->engine().Stats(), model->StallHistogram(), model->PackBytesRead(), 0, 0};
      for (const auto& s : sessions) {
        if (&s->model() != model) continue;
        ++r.sessions;
        r.leases += s->counters().leases_held;
      }
      rows.push_back(std::move(r));
    }
  }
  const auto counter = [&](const char* name, const char* help, auto get) {
    Header(out, name, "counter", help);
    for (const Row& r : rows) out << name << "{model=\"" << r.model << "\"} " << get(r) << '\n';
  };
  Header(out, "expertd_up", "gauge", "1 while the daemon serves, 0 while starting or draining.");
  out << "expertd_up " << (state.serving.load() ? 1 : 0) << '\n';
  counter("expertd_slot_hits_total", "Acquired experts that were resident.",
          [](const Row& r) { return r.e.pool.hits; });
  counter("expertd_client_hits_total",
          "Of those, hits clients made on their own through the residency table and reported.",
          [](const Row& r) { return r.e.pool.client_hits; });
  counter("expertd_pinned_skips_total", "Eviction victims skipped because a client pinned them.",
          [](const Row& r) { return r.e.pool.pinned_skips; });
  counter("expertd_slot_misses_total", "Acquired experts that needed a read.",
          [](const Row& r) { return r.e.pool.misses; });
  counter("expertd_slot_joins_total", "Acquired experts that joined a read in flight.",
          [](const Row& r) { return r.e.pool.joins; });
  counter("expertd_evictions_total", "Bundles evicted from slots.",
          [](const Row& r) { return r.e.pool.evictions; });
  counter("expertd_prefetch_issued_total", "Prefetches started.",
          [](const Row& r) { return r.e.pool.prefetch_issued; });
  counter("expertd_prefetch_used_total", "Prefetched bundles later acquired.",
          [](const Row& r) { return r.e.pool.prefetch_used; });
  counter("expertd_prefetch_wasted_total", "Prefetched bundles evicted unused.",
          [](const Row& r) { return r.e.pool.prefetch_wasted; });
  counter("expertd_fills_failed_total", "Slot fills that failed (read or copy errors).",
          [](const Row& r) { return r.e.fills_failed; });
  counter("expertd_copied_bytes_total", "Bytes that landed in slots (copied or read in place).",
          [](const Row& r) { return r.e.bytes_copied; });
  counter("expertd_direct_bytes_total",
          "Of those, bytes copied straight from registered pack mappings (no read).",
          [](const Row& r) { return r.e.bytes_direct; });
  Header(out, "expertd_pack_read_bytes_total", "counter", "Bytes read from each pack file.");
  for (const Row& r : rows) {
    for (const auto& [pack, bytes] : r.packs) {
      out << "expertd_pack_read_bytes_total{model=\"" << r.model << "\",pack=\""
          << Label(pack) << "\"} " << bytes << '\n';
    }
  }
  Header(out, "expertd_sessions", "gauge", "Open sessions.");
  for (const Row& r : rows) out << "expertd_sessions{model=\"" << r.model << "\"} " << r.sessions << '\n';
  Header(out, "expertd_leases", "gauge", "Leases held by open sessions.");
  for (const Row& r : rows) out << "expertd_leases{model=\"" << r.model << "\"} " << r.leases << '\n';
  // Per session: its transport and, for lane sessions, the lane's counters. The session label is
  // the id's first 8 hex digits, as in GetStats.
  Header(out, "expertd_session_info", "gauge",
         "1 per open session, labelled with its client, pid and transport (lane or stream).");
  std::vector<std::pair<std::string, v1::SessionStats>> per_session;
  for (const auto& s : sessions) {
    v1::SessionStats st = s->Stats();
    const std::string labels =
        absl::StrCat("session=\"", st.session(), "\",model=\"", Label(s->model().name()), "\"");
    out << "expertd_session_info{" << labels << ",client=\"" << Label(st.client_name())
        << "\",pid=\"" << st.client_pid() << "\",transport=\"" << st.transport() << "\"} 1\n";
    per_session.emplace_back(labels, std::move(st));
  }
  const auto lane_counter = [&](const char* name, const char* help, auto get) {
    Header(out, name, "counter", help);
    for (const auto& [labels, st] : per_session) {
      if (st.transport() == "lane") out << name << "{" << labels << "} " << get(st.lane()) << '\n';
    }
  };
  lane_counter("expertd_lane_requests_total", "Requests read from a session's lane.",
               [](const v1::LaneStats& l) { return l.requests(); });
  lane_counter("expertd_lane_responses_total", "Answers written to a session's lane.",
               [](const v1::LaneStats& l) { return l.responses(); });
  lane_counter("expertd_lane_daemon_sleeps_total",
               "Times a session's lane thread slept on its doorbell.",
               [](const v1::LaneStats& l) { return l.daemon_sleeps(); });
  lane_counter("expertd_lane_client_wakes_total",
               "Wakes sent to client threads sleeping on a session's lane.",
               [](const v1::LaneStats& l) { return l.client_wakes(); });
  lane_counter("expertd_lane_deferred_total",
               "Answers that waited for room in a session's response ring.",
               [](const v1::LaneStats& l) { return l.deferred(); });
  Header(out, "expertd_lane_failures_total", "counter",
         "Sessions failed because the client broke the lane protocol.");
  out << "expertd_lane_failures_total " << state.sessions->lane_failures() << '\n';
  Header(out, "expertd_done_record_failures_total", "counter",
         "Sessions ended because the device gave up on their GPU done records (the client's "
         "context failed, or a record stayed pending longer than limits.lease_ttl).");
  out << "expertd_done_record_failures_total " << state.sessions->done_record_failures()
      << '\n';
  // Buckets from 1 µs to ~4 s, in powers of four.
  const std::vector<double> bounds_s = {1e-6, 4e-6, 16e-6, 64e-6, 256e-6, 1e-3,
                                        4e-3, 16e-3, 64e-3, 256e-3, 1.0,   4.0};
  std::vector<uint64_t> bounds_ns;
  for (double b : bounds_s) bounds_ns.push_back(static_cast<uint64_t>(b * 1e9));
  Header(out, "expertd_acquire_stall_seconds", "histogram",
         "Time from an acquire's arrival to its grant, daemon side.");
  for (const Row& r : rows) {
    const std::vector<uint64_t> cum = r.stall.CumulativeAt(bounds_ns);
    const std::string m = r.model;
    for (size_t i = 0; i < bounds_s.size(); ++i) {
      out << "expertd_acquire_stall_seconds_bucket{model=\"" << m << "\",le=\"" << bounds_s[i]
          << "\"} " << cum[i] << '\n';
    }
    out << "expertd_acquire_stall_seconds_bucket{model=\"" << m << "\",le=\"+Inf\"} "
        << r.stall.count() << '\n';
    out << "expertd_acquire_stall_seconds_sum{model=\"" << m << "\"} "
        << static_cast<double>(r.stall.sum_ns()) / 1e9 << '\n';
    out << "expertd_acquire_stall_seconds_count{model=\"" << m << "\"} " << r.stall.count()
        << '\n';
  }
  return out.str();
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& host,
                                                                    int port,
                                                                    ServiceState* state) {
  std::unique_ptr<MetricsServer> m(new MetricsServer());
  m->http_ = std::make_unique<httplib::Server>();
  m->http_->Get("/metrics", [state](const httplib::Request&, httplib::Response& res) {
    res.set_content(RenderMetrics(*state), "text/plain; version=0.0.4; charset=utf-8");
  });
  if (port == 0) {
    m->port_ = m->http_->bind_to_any_port(host);
  } else {
    m->port_ = m->http_->bind_to_port(host, port) ? port : -1;
  }
  if (m->port_ <= 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("metrics.listen: cannot bind ", host, ":", port));
  }
  httplib::Server* http = m->http_.get();
  m->thread_ = std::thread([http] { http->listen_after_bind(); });
  return m;
}

MetricsServer::~MetricsServer() {
  if (http_) http_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace expertd
