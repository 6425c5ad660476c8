"""metrics: the server's Prometheus text exposition (/metrics): request
counters by finish reason and HTTP status, requests refused at capacity, the
responses store's size and evictions,
histograms of per-request latencies and token
counts observed when a completion ends, transcriptions answered and the seconds of
audio they held (by task), and the engine's gauges and counters read from its latest
stats snapshot. Metric names follow vLLM's with an `armllm:` prefix so existing
dashboards map over."""
from __future__ import annotations

import bisect
import threading
from collections import Counter

from armllm.engine.outputs import EngineStats, RequestMetrics

_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0)
_TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000,
                  100000)


class Histogram:
    def __init__(self, name: str, help: str, buckets: tuple):
        self.name, self.help, self.buckets = name, help, buckets
        self.counts = [0] * (len(buckets) + 1)  # the last one: above every bound (+Inf)
        self.sum, self.count = 0.0, 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def render(self, labels: str) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        cum = 0
        for bound, c in zip(self.buckets, self.counts, strict=False):
            cum += c
            lines.append(f'{self.name}_bucket{{{labels},le="{bound}"}} {cum}')
        lines.append(f'{self.name}_bucket{{{labels},le="+Inf"}} {self.count}')
        lines.append(f"{self.name}_sum{{{labels}}} {self.sum!r}")
        lines.append(f"{self.name}_count{{{labels}}} {self.count}")
        return lines


# the engine's metrics: (name, type, help, EngineStats field)
ENGINE_METRICS = (
    ("armllm:num_requests_running", "gauge", "Sequences in the running batch.", "num_running"),
    ("armllm:num_requests_waiting", "gauge", "Sequences waiting to be scheduled.",
     "num_waiting"),
    ("armllm:kv_cache_usage_perc", "gauge",
     "Fraction of KV-cache blocks held by sequences (1 = full).", "kv_usage"),
    ("armllm:kv_cache_blocks", "gauge", "KV-cache blocks in all.", "num_blocks"),
    ("armllm:kv_cache_free_blocks", "gauge", "KV-cache blocks free.", "num_free_blocks"),
    ("armllm:prefix_cache_cached_blocks", "gauge", "Blocks the prefix cache can serve.",
     "num_cached_blocks"),
    ("armllm:prefix_cache_queries_total", "counter",
     "Prompt tokens looked up in the prefix cache.", "prefix_cache_queries"),
    ("armllm:prefix_cache_hits_total", "counter",
     "Prompt tokens served from the prefix cache.", "prefix_cache_hits"),
    ("armllm:num_preemptions_total", "counter", "Sequences preempted.", "num_preemptions"),
    ("armllm:prompt_tokens_total", "counter", "Prompt tokens received.", "num_prompt_tokens"),
    ("armllm:generation_tokens_total", "counter", "Tokens generated.",
     "num_generation_tokens"),
    ("armllm:engine_steps_total", "counter", "Engine steps run.", "num_steps"),
    ("armllm:spec_decode_num_drafts_total", "counter",
     "Speculative verifies: a sequence's steps with draft tokens.", "spec_verifies"),
    ("armllm:spec_decode_num_draft_tokens_total", "counter",
     "Speculative draft tokens proposed and verified.", "spec_draft_tokens"),
    ("armllm:spec_decode_num_accepted_tokens_total", "counter",
     "Speculative draft tokens accepted.", "spec_accepted_tokens"),
)
# per draft position (label position="i"): (name, help, EngineStats field)
POSITION_METRICS = (
    ("armllm:spec_decode_num_draft_tokens_per_pos_total",
     "Speculative draft tokens proposed, by position in the draft.",
     "spec_proposed_by_position"),
    ("armllm:spec_decode_num_accepted_tokens_per_pos_total",
     "Speculative draft tokens accepted, by position in the draft.",
     "spec_accepted_by_position"),
)


class ServerMetrics:
    """Observed on the event loop; rendered from any thread."""

    def __init__(self, model_name: str, extra_labels: dict[str, str] | None = None):
        # extra_labels go on every sample (under Ray Serve: replica="<replica id>")
        self.labels = ",".join([f'model_name="{_escape(model_name)}"',
                                *(f'{k}="{_escape(v)}"' for k, v in (extra_labels or {}).items())])
        self._lock = threading.Lock()
        self.http: Counter[tuple[str, int]] = Counter()   # (route, status)
        self.rejected_overload = 0
        # transcribe / translate -> requests answered, seconds of audio they held
        self.audio_requests: Counter[str] = Counter()
        self.audio_seconds: Counter[str] = Counter()
        self.hist = {
            "ttft": Histogram("armllm:time_to_first_token_seconds",
                              "Time from arrival to the first output token.", _LATENCY_BUCKETS),
            "itl": Histogram("armllm:inter_token_latency_seconds",
                             "Time between consecutive output tokens.", _LATENCY_BUCKETS),
            "tpot": Histogram("armllm:request_time_per_output_token_seconds",
                              "Mean time per output token after the first, per completion.",
                              _LATENCY_BUCKETS),
            "e2e": Histogram("armllm:e2e_request_latency_seconds",
                             "Time from arrival to the last token.", _LATENCY_BUCKETS),
            "queue": Histogram("armllm:request_queue_time_seconds",
                               "Time from arrival to first being scheduled.", _LATENCY_BUCKETS),
            "prompt": Histogram("armllm:request_prompt_tokens",
                                "Prompt tokens per request.", _TOKEN_BUCKETS),
            "generation": Histogram("armllm:request_generation_tokens",
                                    "Generated tokens per completion.", _TOKEN_BUCKETS),
        }

    def observe_completion(self, m: RequestMetrics | None, first: bool) -> None:
        """A completion the client received ended; `first` marks a request's first
        completion (its prompt is counted once)."""
        with self._lock:
            if m is None:
                return
            h = self.hist
            if first:
                h["prompt"].observe(m.num_prompt_tokens)
            h["generation"].observe(m.num_output_tokens)
            if m.queue_s is not None:
                h["queue"].observe(m.queue_s)
            if m.ttft_s is not None:
                h["ttft"].observe(m.ttft_s)
            if m.e2e_s is not None:
                h["e2e"].observe(m.e2e_s)
            if m.tpot_s is not None:
                h["tpot"].observe(m.tpot_s)
            for gap in m.itl_s:
                h["itl"].observe(gap)

    def observe_transcription(self, task: str, audio_seconds: float) -> None:
        """A transcription (task "transcribe") or translation was answered in full."""
        with self._lock:
            self.audio_requests[task] += 1
            self.audio_seconds[task] += audio_seconds

    def observe_http(self, route: str, status: int) -> None:
        with self._lock:
            self.http[(route, status)] += 1

    def render(self, stats: EngineStats, in_flight: int,
               replicas: list[tuple[int, bool, EngineStats | None]] | None = None,
               responses: tuple[int, int] = (0, 0)) -> str:
        """The exposition text. With data-parallel `replicas` ((index, alive, stats)),
        every engine metric is given per replica (label replica="i"), with
        armllm:replica_up saying which serve. `responses`: the responses stored and
        those evicted (by size or age) so far."""
        lb = self.labels
        out: list[str] = []

        def metric(name: str, kind: str, help: str, value, labels: str = lb) -> None:
            out.extend([f"# HELP {name} {help}", f"# TYPE {name} {kind}",
                        f"{name}{{{labels}}} {value}"])

        sources = [(lb, stats)] if replicas is None else [
            (f'{lb},replica="{i}"', s) for i, _, s in replicas if s is not None]
        for name, kind, help, field in ENGINE_METRICS:
            out += [f"# HELP {name} {help}", f"# TYPE {name} {kind}"]
            out += [f"{name}{{{labels}}} {getattr(s, field)}" for labels, s in sources]
        for name, help, field in POSITION_METRICS:
            out += [f"# HELP {name} {help}", f"# TYPE {name} counter"]
            out += [f'{name}{{{labels},position="{pos}"}} {count}' for labels, s in sources
                    for pos, count in sorted(getattr(s, field).items())]
        name = "armllm:request_success_total"
        out += [f"# HELP {name} Completions ended, by finish reason.", f"# TYPE {name} counter"]
        for labels, s in sources:
            for reason in sorted({"stop", "length", "abort", "error", *s.finished}):
                out.append(f'{name}{{{labels},finished_reason="{reason}"}} '
                           f"{s.finished.get(reason, 0)}")
        if replicas is not None:
            name = "armllm:replica_up"
            out += [f"# HELP {name} 1 while a data-parallel replica serves, 0 once it died.",
                    f"# TYPE {name} gauge"]
            out += [f'{name}{{{lb},replica="{i}"}} {int(alive)}' for i, alive, _ in replicas]
        metric("armllm:num_requests_in_flight", "gauge",
               "Completions admitted (n per prompt) and not yet answered.", in_flight)
        metric("armllm:responses_stored", "gauge",
               "Responses kept for previous_response_id (/v1/responses).", responses[0])
        metric("armllm:responses_evicted_total", "counter",
               "Stored responses evicted for the store's size or age.", responses[1])
        with self._lock:
            metric("armllm:requests_rejected_overload_total", "counter",
                   "Requests answered 503 because the server was at capacity.",
                   self.rejected_overload)
            for name, help, counts in (
                    ("armllm:transcription_requests_total",
                     "Transcriptions and translations answered in full, by task.",
                     self.audio_requests),
                    ("armllm:audio_seconds_total",
                     "Seconds of audio transcribed or translated, by task.",
                     self.audio_seconds)):
                out += [f"# HELP {name} {help}", f"# TYPE {name} counter"]
                out += [f'{name}{{{lb},task="{task}"}} {counts[task]!r}'
                        for task in ("transcribe", "translate")]
            name = "armllm:http_requests_total"
            out += [f"# HELP {name} HTTP requests answered, by route and status.",
                    f"# TYPE {name} counter"]
            for (route, status), count in sorted(self.http.items()):
                out.append(f'{name}{{{lb},route="{_escape(route)}",status="{status}"}} {count}')
            for h in self.hist.values():
                out.extend(h.render(lb))
        return "\n".join(out) + "\n"


def _escape(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
