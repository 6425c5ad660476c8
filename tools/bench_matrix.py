#!/usr/bin/env python3
"""bench_matrix: issue 13's benchmark matrix in one command: armllm beside
llama.cpp (built by tools/build_llama_cpp.sh) and torch (HF transformers), one
run, same machine, same thread count, every figure with the command that made it.

    python tools/bench_matrix.py [--models smollm2,/work/synth/llama-3.2-1b,...]
        [--isa avx2,avx512] [--steps bound,latency,prefill,concurrent,torch,kernels]
        [--engines armllm,llama.cpp,torch] [--only REGEX] [--repetitions 3]
        [--extra-gguf SMOLLM2-Q8_0.gguf ...] [--quantize-lm-head] [--kernel-isa avx2,avx512]
        [--out DIR] [--merge]
        [--llama-bin DIR] [--lock FILE] [--dry-run]

Models. "smollm2" is armllm's demo GGUF (SmolLM2-135M-Instruct, Q4_1 layers +
Q8_0 head); any other .gguf runs the same way. Its workloads are the issue's
W1 = prompt 128 / generate 128 at batch 1 (TPOT), W2 = 32 x (128 in, 128 out)
at once (output tok/s), W3 = prompt 1,024 / generate 16 (prefill tok/s). A
directory written by tools/make_synthetic.py (hf-bf16/ and <shape>-<TYPE>.gguf)
gets batch-1 TPOT (128 / 128), pp512 and 32-concurrent output tok/s (the latter
skipped for models of hidden size >= 4096, the 8B shape, unless
--concurrent-large: it takes far more than minutes there).

Rows per model. armllm: bf16 (--quantization none), w8a8, w4a8 (quantized at
load from the bf16 weights; a tied or float lm_head stays bf16 unless
--quantize-lm-head, whereas llama.cpp's Q8_0/Q4_0 files quantize theirs), and
each GGUF as stored (--quantization auto); llama.cpp: each GGUF (F16, BF16,
Q8_0, Q4_0 of a synthetic directory; the GGUF itself, plus any --extra-gguf, e.g.
from tools/requant_gguf.py, for smollm2); torch: transformers bf16 prefill (not
at hidden size >= 4096). Rows are matched by format for the ratios: bf16 with
F16/BF16, w8a8 and a stored Q8_0 with Q8_0, w4a8 and a stored Q4_0 with Q4_0;
against the faster llama.cpp row where two match.

Steps (each a subprocess per row, so one failure costs one cell):
  bound       `armllm plan --json`: bytes read per decode step at batch 1 over
              the read bandwidth (measured once by the first plan, or
              --bandwidth-gbs), for each armllm row and each llama.cpp GGUF
  latency     armllm `bench latency` 128/128, TPOT median; llama-bench
              -p 0 -n 128 -d 128 (tg128 after a 128-token context, as W1)
  prefill     armllm `bench latency --input-len P --output-len 2` (16 for W3),
              P / TTFT; llama-bench -p P -n 0; P = 512, or 1,024 for a GGUF model
  concurrent  armllm `bench throughput` 32 x (128, 128), output tok/s;
              llama-server -np 32 through tools/compare_servers.py (`armllm
              bench serve`, concurrency 32)
  torch       tools/torch_prefill.py: a P-token bf16 forward, median
  kernels     `armllm bench kernels` bf16 and w8 at M = 512 under each --isa:
              the AVX-512 vs AVX2 prefill GEMM ratio (target >= 1.8)
armllm rows run under each --isa (ARMLLM_ISA), or once with the automatic choice.
Every armllm and llama-server request decodes greedily (--greedy, not the model's
sampling defaults the benchmarks take otherwise): llama-bench samples nothing.

Output: DIR/matrix.md (tables with the ratios to the issue's targets, then the
commands), DIR/matrix.json (every cell: value, command, error), and each cell's
log and JSON under DIR/cells/. --merge keeps the cells of an earlier
DIR/matrix.json that this run does not redo, so one step or row can be rerun.
Timings on a shared machine are noisy: rows of one step run back to back,
armllm and its llama.cpp match interleaved.
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
STEPS = ("bound", "latency", "prefill", "concurrent", "torch", "kernels")
ENGINES = ("armllm", "llama.cpp", "torch")
THREADS = 2                      # the setting: 2 threads everywhere
W1_IN, W1_OUT = 128, 128         # batch-1 TPOT workload
W2_PROMPTS, W2_IN, W2_OUT = 32, 128, 128
W3_IN, W3_OUT = 1024, 16         # SmolLM2 prefill workload
PP_LEN = 512                     # pp512 at real shapes
PP_OUT = 2                       # armllm bench latency needs 2 output tokens for a TPOT
LARGE_HIDDEN = 4096              # the 8B shape: no torch row (16 GB of bf16 twice over in
                                 # torch's load); 32-concurrent skipped unless asked
# targets (issue 13, "Targets")
TPOT_BOUND_MAX = 1.15
PP_BF16_VS_LLAMA = 1.5
PP_QUANT_VS_LLAMA = 1.0
CONC_VS_LLAMA = 2.0
W3_VS_TORCH = 1.5
AVX512_VS_AVX2 = 1.8
ARMLLM_SCHEMES = (("bf16", "none", "bf16"), ("w8a8", "w8a8", "q8_0"), ("w4a8", "w4a8", "q4_0"))
LLAMA_BINARIES = ("llama-bench", "llama-server")
GGUF_KIND = re.compile(r"[-.](F16|BF16|Q8_0|Q4_0|Q4_1|Q5_0|Q5_1|Q[2-6]_K(?:_[SML])?)$", re.I)


def match_key(gguf_type: str) -> str:
    """The format class a GGUF's type is compared within (F16 and BF16 are both 'bf16')."""
    t = gguf_type.lower()
    return "bf16" if t in ("f16", "bf16") else t


def gguf_type(path: Path) -> str:
    m = GGUF_KIND.search(path.stem)
    return m.group(1).upper() if m else "GGUF"


# -- what runs ---------------------------------------------------------------------------

@dataclass
class Row:
    """One line of a model's table: an engine on one checkpoint in one format."""
    label: str
    engine: str                  # armllm | llama.cpp | torch
    path: Path
    key: str                     # format class for the ratios (bf16, q8_0, q4_0, ...)
    quantization: str = ""       # armllm --quantization
    isa: str = ""                # armllm ARMLLM_ISA ("" = automatic)
    head: bool = False           # armllm --quantize-lm-head


@dataclass
class Model:
    name: str
    kind: str                    # "gguf" (W1/W2/W3) or "synthetic" (TPOT/pp512/32-conc)
    rows: list[Row]
    hidden: int = 0


@dataclass
class Cell:
    """One figure: a step of one row; value None when it failed (error says why)."""
    id: str
    model: str
    row: str
    metric: str
    command: str
    value: float | None = None
    unit: str = ""
    error: str = ""
    extra: dict = field(default_factory=dict)
    engine: str = ""             # the row's, so a report can be made from cells alone
    key: str = ""


def scheme_rows(path: Path, isa: str, head: bool) -> list[Row]:
    """armllm's bf16, w8a8 and w4a8 rows; head: the quantized ones quantize a float
    lm_head too, as llama.cpp's Q8_0/Q4_0 files store it."""
    suffix = f" [{isa}]" if isa else ""
    return [Row(f"armllm {name}{'+head' if head and quant != 'none' else ''}{suffix}",
                "armllm", path, key, quant, isa, head and quant != "none")
            for name, quant, key in ARMLLM_SCHEMES]


def synthetic_model(folder: Path, isas: list[str], extra: list[Path], head: bool) -> Model:
    hf = folder / "hf-bf16"
    shape = folder.name
    config = json.loads((hf / "config.json").read_text()) if (hf / "config.json").exists() else {}
    rows = []
    for isa in isas:
        suffix = f" [{isa}]" if isa else ""
        rows += scheme_rows(hf, isa, head)
        for t in ("Q8_0", "Q4_0"):
            rows.append(Row(f"armllm {t} as stored{suffix}", "armllm",
                            folder / f"{shape}-{t}.gguf", match_key(t), "auto", isa))
    for t in ("F16", "BF16", "Q8_0", "Q4_0"):
        rows.append(Row(f"llama.cpp {t}", "llama.cpp", folder / f"{shape}-{t}.gguf",
                        match_key(t)))
    for path in extra:
        rows.append(Row(f"llama.cpp {gguf_type(path)} ({path.name})", "llama.cpp", path,
                        match_key(gguf_type(path))))
    hidden = config.get("hidden_size", 0)
    if hidden < LARGE_HIDDEN:  # the issue asks torch at 1B and SmolLM2; 8B would not fit
        rows.append(Row("torch bf16 (transformers)", "torch", hf, "bf16"))
    return Model(shape, "synthetic", rows, hidden)


def gguf_model(path: Path, isas: list[str], extra: list[Path], head: bool) -> Model:
    stored = gguf_type(path)
    rows = []
    for isa in isas:
        suffix = f" [{isa}]" if isa else ""
        rows.append(Row(f"armllm as stored ({stored}){suffix}", "armllm", path,
                        match_key(stored), "auto", isa))
        rows += scheme_rows(path, isa, head)
    for p in [path, *extra]:
        rows.append(Row(f"llama.cpp {gguf_type(p)}", "llama.cpp", p, match_key(gguf_type(p))))
    rows.append(Row("torch bf16 (transformers)", "torch", path, "bf16"))
    return Model(path.name, "gguf", rows)


def measured_bandwidth(cells: list[Cell]) -> float | None:
    """The read bandwidth that the bound cells used (one per run), if any."""
    return next((c.extra["bandwidth_gbs"] for c in cells if c.metric == "bound_ms"
                 and c.value is not None), None)


def model_from_json(doc: dict) -> Model:
    rows = [Row(**{**r, "path": Path(r["path"])}) for r in doc["rows"]]
    return Model(doc["name"], doc["kind"], rows, doc.get("hidden", 0))


def merge_models(earlier: list[Model], now: list[Model]) -> list[Model]:
    """The models of an earlier run and this one, a model in both with the rows of both."""
    merged = {m.name: m for m in earlier}
    for m in now:
        if m.name in merged:
            labels = {r.label for r in merged[m.name].rows}
            merged[m.name].rows += [r for r in m.rows if r.label not in labels]
        else:
            merged[m.name] = m
    return list(merged.values())


def resolve_models(spec: str, isas: list[str], extra: list[Path], head: bool) -> list[Model]:
    models = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        if item == "smollm2":
            from armllm.cmdline import resolve_model
            models.append(gguf_model(Path(resolve_model(None)), isas, extra, head))
            continue
        path = Path(item)
        if path.is_dir():
            models.append(synthetic_model(path, isas, [], head))
        elif path.suffix == ".gguf" and path.is_file():
            models.append(gguf_model(path, isas, [], head))
        else:
            raise SystemExit(f"--models: {item!r} is neither smollm2, a .gguf file nor a "
                             "directory written by tools/make_synthetic.py")
    return models


# -- running a cell ----------------------------------------------------------------------

class Runner:
    """Runs the cells' commands one at a time, each with its log and JSON file."""

    def __init__(self, out: Path, timeout: float, first_id: int = 1, dry_run: bool = False,
                 lock: Path | None = None):
        self.cells_dir = out / "cells"
        self.timeout = timeout
        self.lock = lock            # held (flock) while each cell runs
        self.dry_run = dry_run
        self.first_id = first_id    # after an earlier run's cells under --merge
        self.cells: list[Cell] = []

    def next_id(self) -> str:
        return f"c{self.first_id + len(self.cells)}"

    def run(self, model: str, row: Row | str, metric: str, cmd: list[str], parse,
            env: dict[str, str] | None = None, json_arg: bool = True,
            unit: str = "", needs: tuple[Path, ...] = ()) -> Cell:
        """Run cmd (with `--json FILE` appended unless json_arg is False, when the
        command writes JSON to stdout) and parse(json_doc) -> (value, extra); a file
        in `needs` that does not exist fails the cell without running it."""
        cid = self.next_id()
        log = self.cells_dir / f"{cid}.log"
        out_json = self.cells_dir / f"{cid}.json"
        full = [*cmd, "--json", str(out_json)] if json_arg else cmd
        shown = " ".join(f"{k}={v}" for k, v in (env or {}).items())
        shown = (shown + " " if shown else "") + shlex.join(
            ["python" if a == sys.executable and PYTHON_ON_PATH else a for a in full])
        label, engine, key = ((row, "armllm", "") if isinstance(row, str)
                              else (row.label, row.engine, row.key))
        cell = Cell(cid, model, label, metric, shown, unit=unit, engine=engine, key=key)
        self.cells.append(cell)
        print(f"[{cid}] {model} | {label} | {metric}\n      $ {shown}", flush=True)
        if self.dry_run:
            return cell
        self.cells_dir.mkdir(parents=True, exist_ok=True)
        missing = [p for p in needs if not p.exists()]
        if missing:
            cell.error = f"missing file: {missing[0]}"
            if missing[0].name in LLAMA_BINARIES:
                cell.error += " (build it with tools/build_llama_cpp.sh)"
            print(f"      FAILED: {cell.error}", flush=True)
            return cell
        out_json.unlink(missing_ok=True)  # a file of an earlier run is no result of this one
        t0 = time.monotonic()
        try:
            with open(log, "w") as f, held(self.lock):
                code, stdout = run_group(full, f, {**os.environ, **(env or {})}, self.timeout)
                f.write("\n---- stdout ----\n" + stdout)
            if code != 0:
                raise RuntimeError(f"exit code {code}: " + last_lines(log))
            doc = json.loads(out_json.read_text()) if json_arg else stdout_json(stdout)
            cell.value, cell.extra = parse(doc)
        except subprocess.TimeoutExpired:
            cell.error = f"timed out after {self.timeout:.0f} s"
        except Exception as exc:  # noqa: BLE001 - any failure is this cell's, the run goes on
            cell.error = f"{type(exc).__name__}: {exc}"
        cell.extra["wall_s"] = round(time.monotonic() - t0, 1)
        status = (f"FAILED: {cell.error}" if cell.error
                  else f"{cell.value:.4g} {cell.unit} ({cell.extra['wall_s']} s)")
        print(f"      {status}", flush=True)
        return cell


@contextlib.contextmanager
def held(lock: Path | None):
    """An exclusive flock on `lock` (nothing for None) for the with-block: other
    benchmarks on the machine that take the same lock (`flock FILE CMD`) wait."""
    if lock is None:
        yield
        return
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def run_group(cmd: list[str], stderr, env: dict[str, str], timeout: float) -> tuple[int, str]:
    """Run cmd in its own process group, so that on a timeout (or Ctrl-C) the servers
    it started go down with it; (exit code, stdout)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env,
                            start_new_session=True)
    try:
        stdout, _ = proc.communicate(timeout=timeout)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return proc.returncode, stdout


def stdout_json(text: str):
    """The JSON document a command printed, from the first line that opens one."""
    start = re.search(r"^[\[{]", text, re.M)
    if start is None:
        raise ValueError("no JSON on stdout")
    return json.JSONDecoder().raw_decode(text, start.start())[0]


def last_lines(log: Path, n: int = 3) -> str:
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()
             and not ln.startswith("----")]
    return " | ".join(lines[-n:])[-400:]


def _python_on_path() -> bool:
    """Whether `python` on PATH is this interpreter, so commands can show it so."""
    found = shutil.which("python")
    return found is not None and Path(found).resolve() == Path(sys.executable).resolve()


PYTHON_ON_PATH = _python_on_path()


def armllm_env(row: Row) -> dict[str, str]:
    return {"ARMLLM_ISA": row.isa} if row.isa else {}


def armllm_cmd(sub: list[str], row: Row) -> list[str]:
    """An armllm bench command of a row, greedy (see the module's docstring)."""
    return [sys.executable, "-m", "armllm", *sub, str(row.path), "--quantization",
            row.quantization, "--threads", str(THREADS), "--greedy",
            *(["--quantize-lm-head"] if row.head else [])]


def _median_ts(test: dict) -> float:
    samples = test.get("samples_ts") or [test["avg_ts"]]
    return statistics.median(samples)


def llama_bench_parse(kind: str):
    def parse(doc: list) -> tuple[float, dict]:
        test = doc[0]
        ts = _median_ts(test)
        value = 1e3 / ts if kind == "tpot" else ts
        return value, {"tokens_per_s": ts, "samples_ts": test.get("samples_ts"),
                       "build_commit": test.get("build_commit"),
                       "cpu_info": test.get("cpu_info")}
    return parse


# -- the steps ---------------------------------------------------------------------------

class Matrix:
    def __init__(self, args: argparse.Namespace, runner: Runner):
        self.args = args
        self.r = runner
        self.bandwidth = args.bandwidth_gbs
        self.only = re.compile(args.only) if args.only else None
        self.llama_bench, self.llama_server = (args.llama_bin / b for b in LLAMA_BINARIES)

    def rows(self, model: Model, engines: tuple[str, ...]) -> list[Row]:
        chosen = [r for r in model.rows if r.engine in engines
                  and r.engine in self.args.engines
                  and (self.only is None or self.only.search(r.label))]
        # interleave armllm rows with the llama.cpp rows of their format, so that a
        # change in machine load hits both sides of a comparison alike
        return sorted(chosen, key=lambda r: (r.key, ENGINES.index(r.engine)))

    def step_bound(self, m: Model) -> None:
        for row in self.rows(m, ("armllm", "llama.cpp")):
            quant = row.quantization if row.engine == "armllm" else "auto"
            cmd = [sys.executable, "-m", "armllm", "plan", str(row.path), "--quantization", quant,
                   "--threads", str(THREADS), "--max-num-seqs", "1",
                   "--max-model-len", str(W1_IN + W1_OUT), "--json",
                   *(["--quantize-lm-head"] if row.head else [])]
            if self.bandwidth:
                cmd += ["--bandwidth-gbs", f"{self.bandwidth:.2f}"]

            def parse(doc: dict) -> tuple[float, dict]:
                b1 = doc["decode"]["batch_1"]
                return b1["min_step_s"] * 1e3, {"bytes": b1["bytes"],
                                                "bandwidth_gbs": doc["decode"]["bandwidth_gbs"]}
            cell = self.r.run(m.name, row, "bound_ms", cmd, parse,
                              env=armllm_env(row) if row.engine == "armllm" else None,
                              json_arg=False, unit="ms", needs=(row.path,))
            if self.bandwidth is None and cell.value is not None:
                self.bandwidth = cell.extra["bandwidth_gbs"]  # one bandwidth for every bound
                print(f"      read bandwidth {self.bandwidth:.1f} GB/s ({THREADS} threads), "
                      "used for every bound of this run", flush=True)

    def step_latency(self, m: Model) -> None:
        reps = str(self.args.repetitions)
        for row in self.rows(m, ("armllm", "llama.cpp")):
            if row.engine == "armllm":
                cmd = armllm_cmd(["bench", "latency"], row) + [
                    "--input-len", str(W1_IN), "--output-len", str(W1_OUT),
                    "--warmup", "1", "--repetitions", reps]
                self.r.run(m.name, row, "tpot_ms", cmd, lambda d: (
                    d["tpot_s"]["median"] * 1e3, {"ttft_ms": d["ttft_s"]["median"] * 1e3,
                                                  "isa": d["isa"], "weights": d["weights"]}),
                    env=armllm_env(row), unit="ms", needs=(row.path,))
            else:
                cmd = [str(self.llama_bench), "-m", str(row.path), "-p", "0", "-n", str(W1_OUT),
                       "-d", str(W1_IN), "-t", str(THREADS), "-r", reps, "-o", "json"]
                self.r.run(m.name, row, "tpot_ms", cmd, llama_bench_parse("tpot"),
                           json_arg=False, unit="ms", needs=(self.llama_bench, row.path))

    def prefill_len(self, m: Model) -> tuple[int, int]:
        return (W3_IN, W3_OUT) if m.kind == "gguf" else (PP_LEN, PP_OUT)

    def step_prefill(self, m: Model) -> None:
        n_in, n_out = self.prefill_len(m)
        reps = str(self.args.repetitions)
        for row in self.rows(m, ("armllm", "llama.cpp")):
            if row.engine == "armllm":
                cmd = armllm_cmd(["bench", "latency"], row) + [
                    "--input-len", str(n_in), "--output-len", str(n_out),
                    "--warmup", "1", "--repetitions", reps]
                self.r.run(m.name, row, "prefill_tok_s", cmd, lambda d: (
                    d["pp_tokens_per_s"]["median"], {"ttft_ms": d["ttft_s"]["median"] * 1e3,
                                                     "isa": d["isa"]}),
                    env=armllm_env(row), unit="tok/s", needs=(row.path,))
            else:
                cmd = [str(self.llama_bench), "-m", str(row.path), "-p", str(n_in), "-n", "0",
                       "-t", str(THREADS), "-r", reps, "-o", "json"]
                self.r.run(m.name, row, "prefill_tok_s", cmd, llama_bench_parse("pp"),
                           json_arg=False, unit="tok/s", needs=(self.llama_bench, row.path))

    def step_concurrent(self, m: Model) -> None:
        if m.hidden >= LARGE_HIDDEN and not self.args.concurrent_large:
            print(f"[skip] {m.name}: 32-concurrent skipped at hidden size {m.hidden} "
                  "(--concurrent-large runs it)", flush=True)
            return
        for row in self.rows(m, ("armllm", "llama.cpp")):
            if row.engine == "armllm":
                cmd = armllm_cmd(["bench", "throughput"], row) + [
                    "--num-prompts", str(W2_PROMPTS), "--max-num-seqs", str(W2_PROMPTS),
                    "--input-len", str(W2_IN), "--output-len", str(W2_OUT)]
                self.r.run(m.name, row, "concurrent_tok_s", cmd, lambda d: (
                    d["output_tokens_per_s"], {"elapsed_s": d["elapsed_s"],
                                               "preemptions": d["num_preemptions"]}),
                    env=armllm_env(row), unit="tok/s", needs=(row.path,))
            else:
                cmd = [sys.executable, str(TOOLS / "compare_servers.py"), "--llama-server",
                       str(self.llama_server), "--model", str(row.path),
                       "--armllm-quantization", "", "--concurrency", str(W2_PROMPTS),
                       "--num-prompts", str(W2_PROMPTS), "--input-len", str(W2_IN),
                       "--output-len", str(W2_OUT), "--threads", str(THREADS), "--greedy"]

                def parse(doc: dict) -> tuple[float, dict]:
                    (result,) = doc.values()
                    s = result["runs"][0]["summary"]
                    if s["failed"]:
                        raise RuntimeError(f"{s['failed']} requests failed")
                    return s["output_throughput"], {"tpot_ms_median": s["tpot_ms"]["median"]}
                self.r.run(m.name, row, "concurrent_tok_s", cmd, parse, unit="tok/s",
                           needs=(self.llama_server, row.path))

    def step_torch(self, m: Model) -> None:
        n_in, _ = self.prefill_len(m)
        for row in self.rows(m, ("torch",)):
            cmd = [sys.executable, str(TOOLS / "torch_prefill.py"), str(row.path),
                   "--input-len", str(n_in), "--threads", str(THREADS),
                   "--repetitions", str(self.args.repetitions)]
            self.r.run(m.name, row, "prefill_tok_s", cmd, lambda d, n=n_in: (
                d["runs"][str(n)]["tokens_per_s"], {"load_s": d["load_s"]}),
                unit="tok/s", needs=(row.path,))

    def step_kernels(self) -> None:
        if "armllm" not in self.args.engines:
            return
        for isa in self.args.kernel_isa_list:
            cmd = [sys.executable, "-m", "armllm", "bench", "kernels", "--models",
                   self.args.kernel_models, "--m", str(PP_LEN), "--dtypes", "bf16,w8",
                   "--threads", str(THREADS), "--min-time", str(self.args.kernel_min_time),
                   "--no-numpy"]

            def parse(doc: dict) -> tuple[float, dict]:
                rows = [{k: g[k] for k in ("model", "layer", "n", "k", "m", "dtype", "gflops")}
                        for g in doc["gemm"]]
                return statistics.median(g["gflops"] for g in rows), {"gemm": rows}
            self.r.run("kernels", f"armllm [{isa or 'auto'}]", "gemm_gflops_median", cmd, parse,
                       env={"ARMLLM_ISA": isa} if isa else None, unit="GFLOP/s")


# -- the report --------------------------------------------------------------------------

def fmt(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f}" if v >= 100 else f"{v:.2f}" if v >= 1 else f"{v:.3f}"


class Report:
    """Markdown tables from the cells: figures with their command ids, ratios with
    the target they are held to."""

    def __init__(self, cells: list[Cell], models: list[Model]):
        self.cells = cells
        self.models = models
        self.by_key = {(c.model, c.row, c.metric): c for c in cells}

    def cell(self, model: str, row: str, metric: str) -> Cell | None:
        return self.by_key.get((model, row, metric))

    def value(self, model: str, row: str, metric: str) -> float | None:
        c = self.cell(model, row, metric)
        return c.value if c else None

    def figure(self, model: str, row: str, metric: str) -> str:
        c = self.cell(model, row, metric)
        if c is None:
            return "-"
        return f"FAIL [{c.id}]" if c.value is None else f"{fmt(c.value)} [{c.id}]"

    @staticmethod
    def ratio(num: float | None, den: float | None, target: float, at_most: bool) -> str:
        if num is None or not den:
            return "-"
        r = num / den
        ok = r <= target if at_most else r >= target
        return f"{r:.2f} {'ok' if ok else 'MISS'}"

    def best(self, model: Model, engine: str, key: str | None, metric: str,
             lower: bool) -> float | None:
        values = [c.value for c in self.cells if c.model == model.name and c.metric == metric
                  and c.engine == engine and (key is None or c.key == key)
                  and c.value is not None]
        if not values:
            return None
        return min(values) if lower else max(values)

    def model_table(self, m: Model) -> list[str]:
        n = m.name
        rows = list(m.rows)
        for c in self.cells:  # rows of an earlier run (--merge) that this one does not list
            if c.model == n and c.engine and c.row not in {r.label for r in rows}:
                rows.append(Row(c.row, c.engine, Path(), c.key))
        rows = sorted((r for r in rows if any(c.model == n and c.row == r.label
                                              for c in self.cells)),
                      key=lambda r: ENGINES.index(r.engine))
        if not rows:
            return []
        if m.kind == "gguf":
            out = [f"### {n}: W1 = {W1_IN}/{W1_OUT} batch 1, W2 = {W2_PROMPTS} x "
                   f"({W2_IN}, {W2_OUT}) at once, W3 = {W3_IN}/{W3_OUT}", "",
                   "| engine / format | W1 TPOT ms | bound ms | TPOT / bound (<= 1.15) | "
                   "W2 out tok/s | W2 / best llama.cpp (>= 2) | W3 prefill tok/s | "
                   "W3 / torch bf16 (>= 1.5) |", "|---" * 8 + "|"]
        else:
            out = [f"### {n}: TPOT at {W1_IN}/{W1_OUT} batch 1, pp{PP_LEN}, "
                   f"{W2_PROMPTS}-concurrent ({W2_IN}, {W2_OUT})", "",
                   "| engine / format | TPOT ms | bound ms | TPOT / bound (<= 1.15) | "
                   "TPOT / llama.cpp (<= 1) | pp512 tok/s | pp512 / llama.cpp (>= 1.5 bf16, "
                   ">= 1 Q8_0/Q4_0) | 32-conc out tok/s | / llama-server (>= 2) |",
                   "|---" * 9 + "|"]
        torch_pp = self.best(m, "torch", None, "prefill_tok_s", lower=False)
        best_llama_conc = self.best(m, "llama.cpp", None, "concurrent_tok_s", lower=False)
        for r in rows:
            tpot = self.value(n, r.label, "tpot_ms")
            bound = self.value(n, r.label, "bound_ms")
            pp = self.value(n, r.label, "prefill_tok_s")
            conc = self.value(n, r.label, "concurrent_tok_s")
            arm = r.engine == "armllm"
            cols = [r.label, self.figure(n, r.label, "tpot_ms"),
                    self.figure(n, r.label, "bound_ms"),
                    self.ratio(tpot, bound, TPOT_BOUND_MAX, at_most=True)]
            if m.kind == "gguf":
                cols += [self.figure(n, r.label, "concurrent_tok_s"),
                         self.ratio(conc, best_llama_conc, CONC_VS_LLAMA, False) if arm else "",
                         self.figure(n, r.label, "prefill_tok_s"),
                         self.ratio(pp, torch_pp, W3_VS_TORCH, False) if arm else ""]
            else:
                llama_tpot = self.best(m, "llama.cpp", r.key, "tpot_ms", lower=True)
                llama_pp = self.best(m, "llama.cpp", r.key, "prefill_tok_s", lower=False)
                llama_conc = self.best(m, "llama.cpp", r.key, "concurrent_tok_s", lower=False)
                pp_target = PP_BF16_VS_LLAMA if r.key == "bf16" else PP_QUANT_VS_LLAMA
                cols += [self.ratio(tpot, llama_tpot, 1.0, True) if arm else "",
                         self.figure(n, r.label, "prefill_tok_s"),
                         self.ratio(pp, llama_pp, pp_target, False) if arm else "",
                         self.figure(n, r.label, "concurrent_tok_s"),
                         self.ratio(conc, llama_conc, CONC_VS_LLAMA, False) if arm else ""]
            out.append("| " + " | ".join(cols) + " |")
        return out + [""]

    def kernel_table(self) -> list[str]:
        by_isa = {c.row: c for c in self.cells if c.model == "kernels" and c.value is not None}
        if not by_isa:
            return []
        isas = list(by_isa)
        pair = ("armllm [avx2]", "armllm [avx512]")
        both = all(i in by_isa for i in pair)
        out = ["### prefill GEMM (armllm bench kernels, M = 512, GFLOP/s; int8 GOP/s)", "",
               "| layer | dtype | " + " | ".join(f"{i} [{by_isa[i].id}]" for i in isas)
               + (" | avx512 / avx2 (>= 1.8) |" if both else " |"),
               "|---" * (2 + len(isas) + both) + "|"]
        gemms = {}
        for isa, c in by_isa.items():
            for g in c.extra["gemm"]:
                gemms.setdefault((g["model"], g["layer"], g["dtype"]), {})[isa] = g["gflops"]
        for (model, layer, dtype), v in gemms.items():
            cols = [f"{model} {layer}", dtype, *(fmt(v.get(i)) for i in isas)]
            if both:
                cols.append(self.ratio(v.get(pair[1]), v.get(pair[0]), AVX512_VS_AVX2, False))
            out.append("| " + " | ".join(cols) + " |")
        return out + [""]

    def markdown(self, header: list[str]) -> str:
        out = ["# armllm benchmark matrix (issue 13)", "", *header, ""]
        for m in self.models:
            out += self.model_table(m)
        out += self.kernel_table()
        failed = [c for c in self.cells if c.error]
        if failed:
            out += ["## failed cells", ""]
            out += [f"- [{c.id}] {c.model} | {c.row} | {c.metric}: {c.error}" for c in failed]
            out.append("")
        out += ["## commands", ""]
        out += [f"- [{c.id}] `{c.command}`" for c in self.cells]
        return "\n".join(out) + "\n"


# -- main --------------------------------------------------------------------------------

def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "armllm"


def default_llama_bin() -> Path:
    return cache_dir() / "llama.cpp-0.3.36" / "build" / "bin"  # tools/build_llama_cpp.sh


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.splitlines()[1:]))
    ap.add_argument("--models", default="smollm2,/work/synth/llama-3.2-1b,/work/synth/llama-3.1-8b",
                    help="comma-separated: smollm2, a .gguf, or a make_synthetic directory")
    ap.add_argument("--isa", default="", help="comma-separated ARMLLM_ISA values for the armllm "
                    "rows, e.g. avx2,avx512 (default: the automatic choice, once)")
    ap.add_argument("--steps", default=",".join(STEPS), help="comma-separated among "
                    + ", ".join(STEPS))
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--only", help="a regular expression: only rows whose label matches")
    ap.add_argument("--repetitions", type=int, default=3,
                    help="measured repetitions per latency/prefill cell (median; default 3)")
    ap.add_argument("--extra-gguf", action="append", default=[], type=Path,
                    help="another GGUF of the smollm2 model for llama.cpp (e.g. its Q8_0)")
    ap.add_argument("--bandwidth-gbs", type=float,
                    help="read bandwidth for the bounds (default: measured by the first plan)")
    ap.add_argument("--quantize-lm-head", action="store_true",
                    help="the w8a8/w4a8 rows quantize a float lm_head too (rows named +head), "
                    "as llama.cpp's Q8_0/Q4_0 files hold theirs; default: it stays bf16")
    ap.add_argument("--concurrent-large", action="store_true",
                    help="also run 32-concurrent for hidden size >= 4096 (the 8B shape)")
    ap.add_argument("--kernel-models", default="llama-3.1-8b",
                    help="shapes for the kernels step (armllm bench kernels --models)")
    ap.add_argument("--kernel-min-time", type=float, default=0.5)
    ap.add_argument("--kernel-isa",
                    help="comma-separated ARMLLM_ISA values for the kernels step (default: --isa)")
    ap.add_argument("--llama-bin", type=Path, default=default_llama_bin(),
                    help="folder of llama-bench and llama-server (tools/build_llama_cpp.sh)")
    ap.add_argument("--cell-timeout", type=float, default=3600, help="seconds per cell")
    ap.add_argument("--lock", type=Path,
                    help="a file to hold an exclusive flock on while each cell runs, so that "
                         "other timing runs on a shared machine (flock FILE CMD) take turns")
    ap.add_argument("--out", type=Path, default=cache_dir() / "bench_matrix",
                    help="results folder (default: %(default)s)")
    ap.add_argument("--dry-run", action="store_true",
                    help="print the cells and their commands without running them")
    ap.add_argument("--merge", action="store_true",
                    help="keep the cells of an earlier OUT/matrix.json that this run does not redo")
    args = ap.parse_args(argv)
    for name, allowed in (("steps", STEPS), ("engines", ENGINES)):
        values = [v for v in getattr(args, name).split(",") if v]
        bad = [v for v in values if v not in allowed]
        if bad:
            ap.error(f"--{name}: unknown {', '.join(bad)} (choose among {', '.join(allowed)})")
        setattr(args, name, values)
    args.isa_list = [v.strip() for v in args.isa.split(",") if v.strip()] or [""]
    args.kernel_isa_list = ([v.strip() for v in args.kernel_isa.split(",") if v.strip()]
                            if args.kernel_isa else args.isa_list)
    if args.repetitions < 1:
        ap.error(f"--repetitions must be >= 1, got {args.repetitions}")
    if args.only:
        try:
            re.compile(args.only)
        except re.error as exc:
            ap.error(f"--only: {exc}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    models = resolve_models(args.models, args.isa_list, args.extra_gguf, args.quantize_lm_head)
    previous: list[Cell] = []
    earlier: list[Model] = []
    if args.merge and (args.out / "matrix.json").exists():
        doc = json.loads((args.out / "matrix.json").read_text())
        previous = [Cell(**c) for c in doc["cells"]]
        earlier = [model_from_json(m) for m in doc["models"]]
    if args.bandwidth_gbs is None:  # the bounds of an earlier run keep their bandwidth
        args.bandwidth_gbs = measured_bandwidth(previous)
    first_id = 1 + max((int(c.id[1:]) for c in previous), default=0)
    runner = Runner(args.out, args.cell_timeout, first_id, args.dry_run, args.lock)
    matrix = Matrix(args, runner)
    t0 = time.monotonic()
    for m in models:
        for step in STEPS[:-1]:
            if step in args.steps:
                getattr(matrix, f"step_{step}")(m)
    if "kernels" in args.steps:
        matrix.step_kernels()
    if args.dry_run:
        print(f"{len(runner.cells)} cells (dry run: nothing ran)")
        return 0
    redone = {(c.model, c.row, c.metric) for c in runner.cells}
    cells = [c for c in previous if (c.model, c.row, c.metric) not in redone] + runner.cells
    from armllm import ops
    info = ops.cpu_info()
    bandwidth = measured_bandwidth(cells)
    header = [f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {info['cpu']}, "
              f"automatic ISA {info['isa']}, {THREADS} threads everywhere; "
              f"this run {time.monotonic() - t0:.0f} s.",
              f"Read bandwidth for the bounds: "
              f"{bandwidth and f'{bandwidth:.1f} GB/s' or 'not measured'}. "
              "[cN] = the command that produced a figure (listed at the end); ratios say ok or "
              "MISS against the issue's target in the column header. llama.cpp TPOT is "
              "1000 / llama-bench's tg128 after a 128-token context; prefill is P / TTFT for "
              "armllm, llama-bench's ppP, a P-token forward for torch. Medians of the "
              "repetitions in each command; the 32-concurrent figures are one run each."]
    models = merge_models(earlier, models)
    report = Report(cells, models)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "matrix.md").write_text(report.markdown(header))
    (args.out / "matrix.json").write_text(json.dumps(
        {"header": header, "models": [{"name": m.name, "kind": m.kind, "hidden": m.hidden,
                                       "rows": [{**asdict(r), "path": str(r.path)}
                                                for r in m.rows]} for m in models],
         "cells": [asdict(c) for c in cells]}, indent=1))
    print("\n" + report.markdown(header))
    print(f"written: {args.out / 'matrix.md'}, {args.out / 'matrix.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
