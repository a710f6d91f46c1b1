// gemma4_t4 implementation part: the report writers of the built-in benchmark -- to_text, to_table, to_json,
// to_csv, to_svg and write_file (declarations and the fields each writes in bench/api.hpp). Pure functions of
// the reports; the T4 projection is labelled "projection, not measured" in every format, with its formula.
// Included by gemma4_t4.hpp inside GEMMA4_T4_IMPLEMENTATION (unless GEMMA4_T4_NO_BENCH).
#pragma once

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "common.hpp"

namespace gemma4_t4 {
namespace detail {
namespace bench_impl {

inline const char* backend_name(Backend b) { return b == Backend::Cuda ? "cuda" : b == Backend::Cpu ? "cpu" : "auto"; }

inline std::string xml_escape(const std::string& s) {
  std::string o;
  for (char ch : s) {
    switch (ch) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += ch;
    }
  }
  return o;
}

inline std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string o = "\"";
  for (char ch : s) o += ch == '"' ? std::string("\"\"") : std::string(1, ch);
  return o + "\"";
}

inline Json device_json(const bench::DeviceReport& d) {
  return Json{{"cuda", d.cuda},
              {"note", d.note},
              {"device", d.device},
              {"name", d.name},
              {"compute_capability", strf("%d.%d", d.cc_major, d.cc_minor)},
              {"sm_count", d.sm_count},
              {"clock_mhz", d.clock_mhz},
              {"fp16_tensor_tflops", d.fp16_tensor_tflops},
              {"memory_total", d.memory_total},
              {"memory_free", d.memory_free},
              {"smem_per_block", d.smem_per_block},
              {"smem_per_block_optin", d.smem_per_block_optin},
              {"smem_per_sm", d.smem_per_sm},
              {"l2_bytes", d.l2_bytes},
              {"kernel_binary_version", d.kernel_binary_version},
              {"kernel_ptx_version", d.kernel_ptx_version},
              {"jit", d.jit},
              {"pdl", d.pdl},
              {"code", d.code},
              {"driver_version", d.driver_version},
              {"runtime_version", d.runtime_version},
              {"host_cpu", d.host_cpu},
              {"host_threads", d.host_threads}};
}

inline Json bandwidth_json(const bench::Bandwidth& b) {
  return Json{{"backend", backend_name(b.backend)},
              {"read_gbs", b.read_gbs},
              {"copy_gbs", b.copy_gbs},
              {"bytes", b.bytes},
              {"repeats", b.repeats},
              {"threads", b.threads},
              {"method", b.method}};
}

// "512", or "3968*" when clamped (the * explained in the notes).
inline std::string prompt_label(const bench::Cell& c) {
  return std::to_string(c.prompt) + (c.prompt != c.requested_prompt ? "*" : "");
}

// A cell to quote the T4 projection's efficiency from: the first that succeeded (lowest concurrency of the
// first prompt, as asked).
inline const bench::Cell* reference_cell(const bench::Report& r) {
  for (const bench::Cell& c : r.cells)
    if (c.ok() && c.pct_of_ceiling > 0) return &c;
  return nullptr;
}

inline std::string projection_ceiling(const bench::Report& r) {
  return strf("T4 projection (%s): %.0f GB/s / %.4g GB per token = %.1f tok/s ceiling per stream", kProjectionLabel,
              r.t4_bandwidth_gbs, r.decode_bytes_per_token / 1e9, r.t4_ceiling_tok_s);
}

inline std::string projection_scaled(const bench::Report& r) {
  if (const bench::Cell* c = reference_cell(r))
    return strf(
        "ms per token = %.4g GB / %.0f GB/s + fixed %.3f ms (%.3f ms measured here - %.4g GB / %.0f GB/s; "
        "prompt %d, concurrency %d) = %.1f tok/s per stream on a T4",
        r.decode_bytes_per_token / 1e9, r.t4_bandwidth_gbs, c->fixed_ms, c->ms_per_token,
        r.decode_bytes_per_token / 1e9, r.bandwidth.read_gbs, c->prompt, c->concurrency, c->t4_tok_s_per_stream);
  return "no cell measured a step time to take the fixed cost from";
}

inline std::string projection_sentence(const bench::Report& r) {
  return projection_ceiling(r) + "; " + projection_scaled(r);
}

// The TTFT projection's formula and its concurrency-1 cells, one line each; "" when no cell has one.
inline std::string ttft_projection(const bench::Report& r) {
  std::string s;
  for (const bench::Cell& c : r.cells) {
    if (c.t4_ttft_ms <= 0) continue;
    const double tflops = c.prefill_flops / (c.ttft_ms_median * 1e9);
    s += strf("  prompt %d: %.3g TFLOP of matmuls, %.1f ms here = %.0f TFLOP/s (%.0f%% of peak) -> %.0f ms on a T4\n",
              c.prompt, c.prefill_flops / 1e12, c.ttft_ms_median, tflops, 100 * tflops / r.device.fp16_tensor_tflops,
              c.t4_ttft_ms);
  }
  if (s.empty()) return s;
  return strf(
             "T4 TTFT projection (%s): TTFT x this GPU's fp16 tensor-core peak (%d SMs x %d MHz x %d FLOP/clock = "
             "%.0f TFLOP/s) / a T4's %.0f TFLOP/s, i.e. the prompt at the fraction of peak reached here\n",
             kProjectionLabel, r.device.sm_count, r.device.clock_mhz,
             fp16_tensor_flops_per_clock(r.device.cc_major * 10 + r.device.cc_minor), r.device.fp16_tensor_tflops,
             r.t4_tensor_tflops) +
         s;
}

}  // namespace bench_impl
}  // namespace detail

namespace bench {

// ---- outputs ----

std::string to_text(const DeviceReport& d) {
  using namespace detail::bench_impl;
  std::string s;
  if (d.cuda) {
    s += strf("CUDA device %d: %s\n", d.device, d.name.c_str());
    s += strf("  compute capability %d.%d, %d SMs, memory %s (%s free), L2 %s\n", d.cc_major, d.cc_minor, d.sm_count,
              human_bytes(double(d.memory_total)).c_str(), human_bytes(double(d.memory_free)).c_str(),
              human_bytes(double(d.l2_bytes)).c_str());
    s += strf("  shared memory: %s per block, %s opt-in per block, %s per SM\n",
              human_bytes(double(d.smem_per_block)).c_str(), human_bytes(double(d.smem_per_block_optin)).c_str(),
              human_bytes(double(d.smem_per_sm)).c_str());
    s += strf("  library code: %s (kernel binary %d, PTX %d); programmatic dependent launch: %s\n", d.code.c_str(),
              d.kernel_binary_version, d.kernel_ptx_version, d.pdl ? "yes" : "no (needs sm_90+ code)");
  } else {
    s += d.note + "\n";
  }
  if (d.driver_version || d.runtime_version)
    s += strf("  CUDA driver %s, runtime %s\n", cuda_version_string(d.driver_version).c_str(),
              cuda_version_string(d.runtime_version).c_str());
  s += strf("  host: %s, %d threads\n", d.host_cpu.empty() ? "unknown CPU" : d.host_cpu.c_str(), d.host_threads);
  return s;
}

std::string to_text(const Bandwidth& b) {
  using namespace detail::bench_impl;
  if (b.backend == Backend::Cuda)
    return strf("stream read %.1f GB/s, copy %.1f GB/s (%s)\n", b.read_gbs, b.copy_gbs, b.method.c_str());
  return strf("host read %.1f GB/s (%s)\n", b.read_gbs, b.method.c_str());
}

std::string to_text(const DoctorReport& d) {
  using namespace detail::bench_impl;
  std::string s = "gemma4_t4 " GEMMA4_T4_VERSION_STRING " doctor\n";
  s += to_text(d.device);
  s += strf("host RAM: %s available of %s\n", human_bytes(double(d.host_ram_available)).c_str(),
            human_bytes(double(d.host_ram_total)).c_str());
  if (!d.model_path.empty()) {
    s += "model " + d.model_path + ": " + (d.model_ok ? d.model_summary : std::string("does not load")) + "\n";
    if (d.model_ok)
      s += strf("  safetensors %s; decode reads %.4g GB per token; GPU memory needed about %s\n",
                human_bytes(double(d.model_file_bytes)).c_str(), d.decode_bytes_per_token / 1e9,
                human_bytes(double(d.model_gpu_bytes)).c_str());
  }
  s += "free disk: " + human_bytes(double(d.disk_free)) + "\n";
  if (d.warnings.empty()) s += "no problems found\n";
  for (const std::string& w : d.warnings) s += "warning: " + w + "\n";
  return s;
}

std::string to_table(const Report& r) {
  using namespace detail::bench_impl;
  std::string s = strf("gemma4_t4 %s benchmark, %s\n", r.version.c_str(), r.timestamp.c_str());
  s += "checkpoint  " + (r.label.empty() ? std::string() : r.label + ": ") + r.model + "\n";
  if (r.backend == Backend::Cuda)
    s += strf("backend     CUDA device %d: %s, cc %d.%d, %d SMs, %s, %s\n", r.device.device, r.device.name.c_str(),
              r.device.cc_major, r.device.cc_minor, r.device.sm_count,
              human_bytes(double(r.device.memory_total)).c_str(), r.device.code.c_str());
  else
    s += strf("backend     CPU: %s, %d threads\n",
              r.device.host_cpu.empty() ? "unknown CPU" : r.device.host_cpu.c_str(), r.device.host_threads);
  s += "bandwidth   " + (r.bandwidth.read_gbs > 0 ? to_text(r.bandwidth) : std::string("not measured\n"));
  s += strf(
      "decode      %.4g GB per token (LM head %s) -> ceiling %.1f tok/s per stream (read bandwidth / bytes "
      "per token)\n",
      r.decode_bytes_per_token / 1e9, detail::lm_head_name(r.lm_head), r.ceiling_tok_s);
  s += strf("memory      weights %s; KV %s per token; budget %s -> %s tokens\n",
            human_bytes(double(r.weight_bytes)).c_str(), human_bytes(double(r.kv_bytes_per_token)).c_str(),
            human_bytes(double(r.kv_budget_bytes)).c_str(), with_commas(r.kv_capacity_tokens).c_str());
  s += strf("sweep       %d output tokens per stream (EOS ignored), repeats %d, seed %llu, context limit %zu\n",
            r.tokens, r.repeats, static_cast<unsigned long long>(r.seed), r.context_limit);
  s += "sampling    " + r.sampling + "\n";
  for (const std::string& n : r.notes) s += "note: " + n + "\n";
  s += "\n";
  // Columns as wide as their widest entry; a failed cell shows its error after the first two.
  std::vector<std::vector<std::string>> rows = {{"prompt", "streams", "tok/s/stream", "tok/s total", "ms/token",
                                                 "TTFT p50 ms", "TTFT p90 ms", "prefill tok/s", "% ceiling",
                                                 "sessions fit"}};
  for (const Cell& c : r.cells) {
    std::vector<std::string> cols = {prompt_label(c), std::to_string(c.concurrency)};
    if (c.repeats > 0)
      cols.insert(cols.end(),
                  {strf("%.1f", c.tok_s_per_stream), strf("%.1f", c.tok_s_total), strf("%.3f", c.ms_per_token),
                   strf("%.1f", c.ttft_ms_median), strf("%.1f", c.ttft_ms_p90), strf("%.0f", c.prefill_tok_s),
                   strf("%.1f", c.pct_of_ceiling), with_commas(c.sessions_fit)});
    rows.push_back(cols);
  }
  std::vector<size_t> w(rows[0].size(), 0);
  for (const auto& row : rows)
    for (size_t i = 0; i < row.size(); ++i) w[i] = std::max(w[i], row[i].size());
  auto line = [&](const std::vector<std::string>& cols) {
    std::string l;
    for (size_t i = 0; i < cols.size(); ++i) l += (i ? "  " : "") + std::string(w[i] - cols[i].size(), ' ') + cols[i];
    return l;
  };
  std::vector<std::string> rule;
  for (size_t x : w) rule.push_back(std::string(x, '-'));
  s += line(rows[0]) + "\n" + line(rule) + "\n";
  for (size_t i = 0; i < r.cells.size(); ++i)
    s += line(rows[i + 1]) + (r.cells[i].ok() ? std::string() : "  error: " + r.cells[i].error) + "\n";
  s += "\n" + projection_sentence(r) + ".\n";
  if (r.t4_ceiling_tok_s > 0) {
    s +=
        strf("%6s  %7s  %12s  %11s   (T4, %s)\n", "prompt", "streams", "tok/s/stream", "tok/s total", kProjectionLabel);
    for (const Cell& c : r.cells)
      if (c.repeats > 0)
        s += strf("%6s  %7d  %12.1f  %11.1f\n", prompt_label(c).c_str(), c.concurrency, c.t4_tok_s_per_stream,
                  c.t4_tok_s_total);
  }
  s += ttft_projection(r);
  if (r.cancelled) s += "the sweep was cancelled: cells marked 'not run' were not measured\n";
  return s;
}

std::string to_json(const DeviceReport& d) { return detail::bench_impl::device_json(d).dump(2) + "\n"; }

std::string to_json(const Bandwidth& b) { return detail::bench_impl::bandwidth_json(b).dump(2) + "\n"; }

std::string to_json(const DoctorReport& d) {
  using Json = detail::bench_impl::Json;
  Json j = {{"schema", "gemma4_t4.doctor/1"},
            {"version", GEMMA4_T4_VERSION_STRING},
            {"device", detail::bench_impl::device_json(d.device)},
            {"host_ram_total", d.host_ram_total},
            {"host_ram_available", d.host_ram_available},
            {"model_path", d.model_path},
            {"model_ok", d.model_ok},
            {"model_summary", d.model_summary},
            {"model_file_bytes", d.model_file_bytes},
            {"model_gpu_bytes", d.model_gpu_bytes},
            {"decode_bytes_per_token", d.decode_bytes_per_token},
            {"disk_free", d.disk_free},
            {"warnings", d.warnings}};
  return j.dump(2) + "\n";
}

std::string to_json(const Report& r) {
  using namespace detail::bench_impl;
  Json cells = Json::array(), t4cells = Json::array();
  for (const Cell& c : r.cells) {
    cells.push_back(Json{{"prompt", c.prompt},
                         {"requested_prompt", c.requested_prompt},
                         {"concurrency", c.concurrency},
                         {"tokens", c.tokens},
                         {"repeats", c.repeats},
                         {"seeds", c.seeds},
                         {"ms_per_token", c.ms_per_token},
                         {"tok_s_per_stream", c.tok_s_per_stream},
                         {"tok_s_total", c.tok_s_total},
                         {"ttft_ms_median", c.ttft_ms_median},
                         {"ttft_ms_p90", c.ttft_ms_p90},
                         {"prefill_tok_s", c.prefill_tok_s},
                         {"pct_of_ceiling", c.pct_of_ceiling},
                         {"sessions_fit", c.sessions_fit},
                         {"prefill_flops", c.prefill_flops},
                         {"error", c.error}});
    t4cells.push_back(Json{{"prompt", c.prompt},
                           {"concurrency", c.concurrency},
                           {"fixed_ms", c.fixed_ms},
                           {"tok_s_per_stream", c.t4_tok_s_per_stream},
                           {"tok_s_total", c.t4_tok_s_total},
                           {"ttft_ms", c.t4_ttft_ms}});
  }
  Json j = {{"schema", "gemma4_t4.bench/1"},
            {"version", r.version},
            {"timestamp", r.timestamp},
            {"label", r.label},
            {"model", r.model},
            {"backend", backend_name(r.backend)},
            {"device", device_json(r.device)},
            {"bandwidth", bandwidth_json(r.bandwidth)},
            {"decode_bytes_per_token", r.decode_bytes_per_token},
            {"lm_head", detail::lm_head_name(r.lm_head)},
            {"ceiling_tok_s", r.ceiling_tok_s},
            {"weight_bytes", r.weight_bytes},
            {"kv",
             {{"budget_bytes", r.kv_budget_bytes},
              {"bytes_per_token", r.kv_bytes_per_token},
              {"capacity_tokens", r.kv_capacity_tokens}}},
            {"context_limit", r.context_limit},
            {"options",
             {{"prompts", r.prompts},
              {"concurrency", r.concurrency},
              {"tokens", r.tokens},
              {"repeats", r.repeats},
              {"seed", r.seed},
              {"sampling", r.sampling}}},
            {"notes", r.notes},
            {"cells", cells},
            {"t4_projection",
             {{"label", kProjectionLabel},
              {"description", projection_sentence(r)},
              {"bandwidth_gbs", r.t4_bandwidth_gbs},
              {"ceiling_tok_s", r.t4_ceiling_tok_s},
              {"tensor_tflops", r.t4_tensor_tflops},
              {"ttft_description", ttft_projection(r)},
              {"cells", t4cells}}},
            {"cancelled", r.cancelled}};
  return j.dump(2) + "\n";
}

std::string to_csv(const Report& r) {
  using namespace detail::bench_impl;
  std::string s =
      "prompt,requested_prompt,concurrency,tokens,repeats,ms_per_token,tok_s_per_stream,tok_s_total,ttft_ms_median,"
      "ttft_ms_p90,prefill_tok_s,pct_of_ceiling,ceiling_tok_s,sessions_fit,weight_bytes,kv_bytes_per_token,"
      "t4_projected_tok_s_per_stream,t4_projected_tok_s_total,t4_projected_ttft_ms,t4_note,error\n";
  for (const Cell& c : r.cells) {
    s += strf("%d,%d,%d,%d,%d,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%llu,%llu,%llu,%.6g,%.6g,%.6g,", c.prompt,
              c.requested_prompt, c.concurrency, c.tokens, c.repeats, c.ms_per_token, c.tok_s_per_stream, c.tok_s_total,
              c.ttft_ms_median, c.ttft_ms_p90, c.prefill_tok_s, c.pct_of_ceiling, r.ceiling_tok_s,
              static_cast<unsigned long long>(c.sessions_fit), static_cast<unsigned long long>(r.weight_bytes),
              static_cast<unsigned long long>(r.kv_bytes_per_token), c.t4_tok_s_per_stream, c.t4_tok_s_total,
              c.t4_ttft_ms);
    s += csv_field(kProjectionLabel) + "," + csv_field(c.error) + "\n";
  }
  return s;
}

std::string to_svg(const Report& r) {
  using namespace detail::bench_impl;
  const double W = 960, H = 530, top = 100, ph = 300, pw = 380;
  const double px[2] = {80, 540};  // left edge of each panel
  const char* colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"};
  std::vector<int> xs = r.concurrency;  // the x categories, ascending, evenly spaced
  std::sort(xs.begin(), xs.end());
  xs.erase(std::unique(xs.begin(), xs.end()), xs.end());
  auto xpos = [&](int panel, int c) {
    const size_t i = size_t(std::lower_bound(xs.begin(), xs.end(), c) - xs.begin());
    return xs.size() < 2 ? px[panel] + pw / 2 : px[panel] + 20 + (pw - 40) * double(i) / double(xs.size() - 1);
  };
  auto value = [](const Cell& c, int panel) { return panel == 0 ? c.tok_s_per_stream : c.tok_s_total; };
  auto text = [](double x, double y, const char* anchor, const char* attrs, const std::string& t) {
    return strf("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\"%s>%s</text>\n", x, y, anchor, attrs,
                xml_escape(t).c_str());
  };
  // the legend's name of each requested prompt (clamped ones say so)
  std::vector<std::string> names;
  for (int p : r.prompts) {
    int shown = p;
    for (const Cell& c : r.cells)
      if (c.requested_prompt == p) shown = c.prompt;
    names.push_back(shown == p ? strf("prompt %d", p) : strf("prompt %d (clamped from %d)", shown, p));
  }

  std::string s = strf(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f "
      "%.0f\" font-family=\"sans-serif\" font-size=\"12\">\n",
      W, H, W, H);
  s += strf("<rect x=\"0\" y=\"0\" width=\"%.0f\" height=\"%.0f\" fill=\"white\"/>\n", W, H);
  s += text(W / 2, 24, "middle", " font-size=\"15\"",
            "gemma4_t4 " + r.version + " - " + (r.label.empty() ? r.model : r.label + " (" + r.model + ")"));
  const std::string runs =
      strf("%d output tokens, %d repeat%s, %s", r.tokens, r.repeats, r.repeats == 1 ? "" : "s", r.timestamp.c_str());
  s += text(W / 2, 44, "middle", " fill=\"#444\"",
            r.backend == Backend::Cuda ? strf("CUDA %s, %s; ", r.device.name.c_str(), r.device.code.c_str()) + runs
                                       : strf("CPU backend, %d threads; ", r.device.host_threads) + runs);
  {  // legend: one row above the panels
    double width = 0;
    for (const std::string& n : names) width += 34 + 7 * double(n.size()) + 18;
    double x = W / 2 - width / 2;
    for (size_t i = 0; i < names.size(); ++i) {
      s += strf("<line x1=\"%.1f\" y1=\"66\" x2=\"%.1f\" y2=\"66\" stroke=\"%s\" stroke-width=\"2\"/>\n", x, x + 26,
                colors[i % 6]);
      s += text(x + 32, 70, "start", "", names[i]);
      x += 34 + 7 * double(names[i].size()) + 18;
    }
  }
  for (int panel = 0; panel < 2; ++panel) {
    const double x0 = px[panel], y0 = top;
    double ymax = panel == 0 ? r.ceiling_tok_s : r.ceiling_tok_s * (xs.empty() ? 1 : xs.front());
    for (const Cell& c : r.cells)
      if (c.repeats > 0) ymax = std::max(ymax, value(c, panel));
    if (!(ymax > 0)) ymax = 1;
    const double raw = ymax * 1.08 / 5, mag = std::pow(10.0, std::floor(std::log10(raw))), norm = raw / mag;
    const double step = (norm <= 1 ? 1 : norm <= 2 ? 2 : norm <= 5 ? 5 : 10) * mag;
    const double top_v = std::ceil(ymax * 1.08 / step) * step;
    auto ypos = [&](double v) { return y0 + ph - ph * v / top_v; };
    const std::string clip = strf("clip%d", panel);
    s += strf("<clipPath id=\"%s\"><rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\"/></clipPath>\n",
              clip.c_str(), x0, y0, pw, ph);
    s += strf("<g class=\"panel\" data-panel=\"%s\">\n", panel == 0 ? "per-stream" : "total");
    s += text(x0 + pw / 2, y0 - 8, "middle", " font-size=\"13\"",
              panel == 0 ? "tok/s per stream" : "tok/s total (all streams)");
    for (double v = 0; v <= top_v * 1.0001; v += step) {
      s += strf("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e5e5e5\"/>\n", x0, ypos(v), x0 + pw,
                ypos(v));
      s += text(x0 - 6, ypos(v) + 4, "end", "", strf("%.6g", v));
    }
    s += strf("<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#333\"/>\n", x0, y0,
              pw, ph);
    for (int c : xs) s += text(xpos(panel, c), y0 + ph + 16, "middle", "", std::to_string(c));
    s += text(x0 + pw / 2, y0 + ph + 34, "middle", "", "concurrency (streams)");
    if (r.ceiling_tok_s > 0) {  // the ceiling: flat per stream; in total, concurrency times it
      std::string d = strf("M%.1f %.1f L%.1f %.1f", x0, ypos(r.ceiling_tok_s), x0 + pw, ypos(r.ceiling_tok_s));
      if (panel == 1) {
        d.clear();
        for (size_t i = 0; i < xs.size(); ++i)
          d += strf("%s%.1f %.1f ", i ? "L" : "M", xpos(panel, xs[i]), ypos(r.ceiling_tok_s * xs[i]));
      }
      s += strf(
          "<path class=\"ceiling\" d=\"%s\" fill=\"none\" stroke=\"#555\" stroke-width=\"1.5\" "
          "stroke-dasharray=\"7 5\" clip-path=\"url(#%s)\"/>\n",
          d.c_str(), clip.c_str());
      if (panel == 0)
        s += text(x0 + pw - 4, ypos(r.ceiling_tok_s) - 4, "end", " fill=\"#555\"",
                  strf("ceiling %.1f tok/s (bandwidth / bytes per token)", r.ceiling_tok_s));
    }
    if (panel == 0 && r.t4_ceiling_tok_s > 0 && r.t4_ceiling_tok_s <= top_v) {
      s += strf(
          "<line class=\"t4\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#b8860b\" "
          "stroke-dasharray=\"2 3\"/>\n",
          x0, ypos(r.t4_ceiling_tok_s), x0 + pw, ypos(r.t4_ceiling_tok_s));
      s += text(x0 + pw - 4, ypos(r.t4_ceiling_tok_s) - 4, "end", " fill=\"#b8860b\"",
                strf("T4 ceiling %.1f tok/s (%s)", r.t4_ceiling_tok_s, kProjectionLabel));
    }
    for (size_t pi = 0; pi < r.prompts.size(); ++pi) {
      const char* color = colors[pi % 6];
      std::string pts, dots;
      for (const Cell& c : r.cells) {
        if (c.requested_prompt != r.prompts[pi] || c.repeats == 0) continue;
        const double x = xpos(panel, c.concurrency), y = ypos(value(c, panel));
        pts += strf("%s%.1f,%.1f", pts.empty() ? "" : " ", x, y);
        dots += strf("<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", x, y, color);
      }
      s += strf(
          "<polyline class=\"series\" data-prompt=\"%d\" points=\"%s\" fill=\"none\" stroke=\"%s\" "
          "stroke-width=\"2\"/>\n",
          r.prompts[pi], pts.c_str(), color);
      s += dots;
    }
    s += "</g>\n";
  }
  const double fy = top + ph + 62;
  s += text(W / 2, fy, "middle", " class=\"projection\" fill=\"#b8860b\"", projection_ceiling(r));
  s += text(W / 2, fy + 18, "middle", " class=\"projection\" fill=\"#b8860b\"", projection_scaled(r));
  s += text(W / 2, fy + 40, "middle", " fill=\"#444\"",
            strf("decode reads %.4g GB per token; measured bandwidth %.1f GB/s; dashed: measured ceiling; dotted: T4 "
                 "ceiling (%s)",
                 r.decode_bytes_per_token / 1e9, r.bandwidth.read_gbs, kProjectionLabel));
  s += "</svg>\n";
  return s;
}

std::string to_text(const HeadFidelity& h) {
  using namespace detail::bench_impl;
  return strf(
      "LM head %s vs f16 over %zu positions: max |dlogit| %.4g, mean %.3g, max relative %.3g; top-1 agreement "
      "%.2f%%, top-5 overlap %.2f%%; decode bytes/token %s -> %s (%.1f%% fewer)\n",
      detail::lm_head_name(h.head), h.positions, h.max_abs_error, h.mean_abs_error, h.max_rel_error, h.top1 * 100,
      h.top5 * 100, human_bytes(h.decode_bytes_f16).c_str(), human_bytes(h.decode_bytes).c_str(),
      h.decode_bytes_f16 > 0 ? 100.0 * (1.0 - h.decode_bytes / h.decode_bytes_f16) : 0.0);
}

std::string to_json(const HeadFidelity& h) {
  using Json = detail::bench_impl::Json;
  Json j = {{"schema", "gemma4_t4.lm_head_fidelity/1"},
            {"head", detail::lm_head_name(h.head)},
            {"positions", h.positions},
            {"max_abs_error", h.max_abs_error},
            {"mean_abs_error", h.mean_abs_error},
            {"max_rel_error", h.max_rel_error},
            {"top1_agreement", h.top1},
            {"top5_overlap", h.top5},
            {"decode_bytes_f16", h.decode_bytes_f16},
            {"decode_bytes", h.decode_bytes},
            {"load_ms", h.load_ms}};
  return j.dump(2) + "\n";
}

Status write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return detail::err(Code::IoError, path, ": cannot open for writing (", std::strerror(errno), ")");
  f.write(text.data(), std::streamsize(text.size()));
  f.close();
  if (!f) return detail::err(Code::IoError, path, ": write failed (", std::strerror(errno), ")");
  return Status::ok();
}

}  // namespace bench
}  // namespace gemma4_t4
