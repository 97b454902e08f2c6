#!/usr/bin/env python3
"""q3moe against llama.cpp on this machine, on the same weights.

Builds llama.cpp from the source that the npm package node-llama-cpp carries (a git bundle of the
llama.cpp release it binds, so only the npm registry is needed), writes the checkpoint as an F16 GGUF
(tools/hf_to_gguf.py) and, for MoE models, as llama.cpp's MXFP4_MOE (experts MXFP4, the rest Q8_0),
checks that llama.cpp's greedy tokens on the F16 file are q3moe's on the BF16 checkpoint, then runs
llama-bench and q3moe bench in alternating rounds and prints both, with their ratios.

Pairs (--pairs):
  bf16    llama.cpp F16          vs  q3moe on the checkpoint as stored (BF16)
  bf16p   llama.cpp F16          vs  q3moe BF16P (the same BF16 values packed losslessly in 12.5 bits)
  w4a8    llama.cpp MXFP4_MOE    vs  q3moe W4A8 with an MXFP8 lm_head (about the same bytes)
  w4a8i   llama.cpp MXFP4_MOE    vs  q3moe w4a8i with an MXINT8 lm_head (integer kernels)
With --avx2 both engines keep to AVX2 + FMA (llama.cpp built for them, q3moe's AVX2 kernels): what an
AVX2-only CPU runs, measured on a CPU with more.
Everything it fetches, builds and writes goes under --work (default build/llama.cpp).
"""
import argparse
import hashlib
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NODE_LLAMA_CPP = "node-llama-cpp@3.22.1"  # pinned: the llama.cpp release is the one its bundle holds
PROMPT = "The capital of France is"
TARGETS = ["llama-bench", "llama-simple", "llama-quantize"]
# q3moe's side of the quantized pairs: `q3moe convert` options and the label. The lm_head is quantized
# too, as MXFP4_MOE's Q8_0 one is, so both read about the same bytes per token.
Q3M_PAIRS = {
    "w4a8": (["--quant", "w4a8", "--head", "mxfp8"], "W4A8, head MXFP8"),
    "w4a8i": (["--quant", "w4a8i", "--head", "mxint8"], "w4a8i, head MXINT8"),
}
# Pairs against llama.cpp's F16 file: q3moe's weights hold the same BF16 values.
F16_PAIRS = {"bf16p": (["--quant", "bf16p"], "BF16P")}
PAIR_NAMES = "bf16, bf16p, w4a8, w4a8i"


def log(msg):
    print(f"[vs] {msg}", file=sys.stderr, flush=True)


def fail(msg):
    print(f"vs_llama_cpp: {msg}", file=sys.stderr)
    sys.exit(1)


def run(cmd, capture=True, raw=False):
    """Runs cmd; on failure names it and shows the end of what it printed. Without capture, what it
    prints goes to stderr as it comes (progress), keeping stdout for the results. With raw, stdout is
    bytes: generated text can end inside a UTF-8 sequence."""
    try:
        if capture:
            r = subprocess.run(cmd, capture_output=True)
            r.stderr = r.stderr.decode(errors="replace")
            if not raw:
                r.stdout = r.stdout.decode(errors="replace")
        else:
            sys.stderr.flush()
            r = subprocess.run(cmd, stdout=sys.stderr.fileno())
    except OSError as e:
        fail(f"{cmd[0]}: {e}")
    if r.returncode != 0:
        out = r.stdout.decode(errors="replace") if raw else r.stdout
        tail = ((r.stderr or "") + (out or ""))[-3000:] if capture else "(its output is above)"
        fail(f"`{' '.join(cmd)}` exited with {r.returncode}\n{tail}")
    return r


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def fetch_llama_source(work):
    src = os.path.join(work, "src")
    if os.path.isfile(os.path.join(src, "CMakeLists.txt")):
        return src
    for tool in ("npm", "git", "tar"):
        if not shutil.which(tool):
            fail(f"{tool} not found (make vs-llama-cpp installs it)")
    dl = os.path.join(work, "download")
    os.makedirs(dl, exist_ok=True)
    log(f"fetching llama.cpp's source: npm pack {NODE_LLAMA_CPP} (about 35 MB)")
    r = run(["npm", "pack", NODE_LLAMA_CPP, "--pack-destination", dl, "--silent"])
    tgz = os.path.join(dl, r.stdout.strip().splitlines()[-1])
    run(["tar", "-xzf", tgz, "-C", dl, "package/llama/gitRelease.bundle", "package/llama/llama.cpp.info.json"])
    tmp = src + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    run(["git", "clone", "--quiet", os.path.join(dl, "package/llama/gitRelease.bundle"), tmp])
    os.replace(tmp, src)
    return src


def llama_release(work):
    try:
        with open(os.path.join(work, "download/package/llama/llama.cpp.info.json")) as f:
            return json.load(f).get("tag", "?")
    except (OSError, ValueError):
        return "?"


AMX_TILECFG = "    _tile_loadconfig(&tc);\n"
AMX_BARRIER = '    __asm__ __volatile__("" : : "r"(&tc) : "memory"); /* q3moe: tile config stored first */\n'


def fix_ggml_amx(src):
    """ggml's AMX kernels die with SIGILL at their first TILELOADD when GCC drops the stores that fill
    the tile configuration before LDTILECFG (llama.cpp PR #26954, open). A compiler barrier between
    them keeps the stores; nothing else changes."""
    path = os.path.join(src, "ggml", "src", "ggml-cpu", "amx", "mmq.cpp")
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        fail(f"{path}: {e}")
    if AMX_BARRIER in text:
        return
    if text.count(AMX_TILECFG) != 1:
        fail(f"{path}: not the llama.cpp release this script patches (use --no-llama-amx)")
    with open(path, "w") as f:
        f.write(text.replace(AMX_TILECFG, AMX_BARRIER + AMX_TILECFG))


# --avx2: the instruction sets of an AVX2-only x86 CPU (the issues' Zen 3), for llama.cpp's build
AVX2_FLAGS = ["-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
              "-DGGML_BMI2=ON", "-DGGML_AVX512=OFF", "-DGGML_AVX_VNNI=OFF"]


def build_llama(work, src, amx, jobs, avx2=False):
    flags = ["-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DGGML_OPENMP=ON", "-DLLAMA_CURL=OFF",
             "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_TESTS=OFF"]
    name, note = "build", "-march=native"
    if avx2:
        flags = [f for f in flags if f != "-DGGML_NATIVE=ON"] + AVX2_FLAGS
        name, note = "build-avx2", "AVX2 + FMA + F16C only"
    elif "amx_tile" in cpu_flags():
        if amx:
            fix_ggml_amx(src)
            name, note = "build-amxfix", "-march=native, ggml's AMX kernels with the tile-configuration fix"
        else:
            # -march=native without the AMX kernels
            no_amx = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
            flags += [f"-DCMAKE_C_FLAGS={no_amx}", f"-DCMAKE_CXX_FLAGS={no_amx}"]
            name, note = "build-noamx", "-march=native without AMX"
    bdir = os.path.join(work, name)
    bins = os.path.join(bdir, "bin")
    if all(os.path.isfile(os.path.join(bins, t)) for t in TARGETS):
        return bins, flags, note
    for tool in ("cmake", "c++"):
        if not shutil.which(tool):
            fail(f"{tool} not found (make vs-llama-cpp installs it)")
    log(f"building llama.cpp ({', '.join(TARGETS)}) in {bdir}: a few minutes")
    run(["cmake", "-S", src, "-B", bdir] + flags)
    run(["cmake", "--build", bdir, "-j", str(jobs), "--target"] + TARGETS, capture=False)
    return bins, flags, note


def checkpoint_key(d):
    """A name for files made from checkpoint d that changes when its config or weights change."""
    h = hashlib.sha1()
    try:
        with open(os.path.join(d, "config.json"), "rb") as f:
            h.update(f.read())
        for fn in sorted(os.listdir(d)):
            if fn.endswith(".safetensors"):
                st = os.stat(os.path.join(d, fn))
                h.update(f"{fn}:{st.st_size}:{st.st_mtime_ns}".encode())
    except OSError as e:
        fail(f"-m {d}: {e}")
    return f"{os.path.basename(os.path.normpath(d))}-{h.hexdigest()[:12]}"


def checkpoint_bytes(d):
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d) if f.endswith(".safetensors"))


def need_space(path, nbytes, what):
    free = shutil.disk_usage(path).free
    if free < nbytes + (1 << 30):
        fail(f"{path}: {free / 1e9:.1f} GB free, {what} needs about {nbytes / 1e9:.1f} GB (and 1 GB to spare)")


def make_file(out, what, est_bytes, cmd, show=True):
    if os.path.isfile(out):
        return out
    need_space(os.path.dirname(out), est_bytes, what)
    log(f"writing {what}: {out}")
    tmp = out + ".part"
    if os.path.exists(tmp):
        os.unlink(tmp)
    run([c.replace("{out}", tmp) for c in cmd], capture=not show)
    os.replace(tmp, out)
    return out


def read_through(paths):
    """Reads files once, so that neither side's timed runs start by reading the disk."""
    total = sum(os.path.getsize(p) for p in paths)
    log(f"reading {total / 1e9:.1f} GB into the page cache")
    buf = bytearray(16 << 20)
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass
    try:
        with open("/proc/meminfo") as f:
            avail = next(int(l.split()[1]) * 1024 for l in f if l.startswith("MemAvailable:"))
        if total > 0.9 * avail:
            log(f"warning: the pair's files ({total / 1e9:.1f} GB) nearly fill the memory available "
                f"({avail / 1e9:.1f} GB), so some runs will read from disk")
    except (OSError, StopIteration):
        pass


def greedy_check(bins, gguf, model, q3moe, threads):
    """llama.cpp's greedy continuation on the F16 GGUF must start with q3moe's first 4 tokens on the
    BF16 checkpoint: otherwise the two runs are not of the same model."""
    # bytes: llama-simple prints each token's piece as it is, even part of a UTF-8 character
    theirs = run([os.path.join(bins, "llama-simple"), "-m", gguf, "-n", "8", PROMPT], raw=True).stdout
    prompt = PROMPT.encode()
    if not theirs.startswith(prompt):
        fail(f"llama-simple printed {theirs[:200]!r}, not the prompt and its continuation")
    theirs = theirs[len(prompt):]
    ours = run([q3moe, "generate", "-m", model, "-p", PROMPT, "-n", "4", "--temp", "0", "--ignore-eos",
                "-t", str(threads)], raw=True).stdout
    if not ours or not theirs.startswith(ours):
        fail(f"{gguf}: llama.cpp's greedy continuation {theirs!r} does not start with q3moe's {ours!r}: "
             "the GGUF is not the same model, so the timings would not compare")
    log(f"greedy check: llama.cpp's 8 tokens start with q3moe's 4 ({ours.decode(errors='replace')!r})")


def llama_bench(bins, gguf, threads, prompts, n_dec, depth, extra):
    lb = [os.path.join(bins, "llama-bench"), "-m", gguf, "-t", str(threads), "-r", "1", "-o", "json"] + extra
    out = {"prefill": {}, "decode_ms": None}
    if prompts:
        for row in json.loads(run(lb + ["-p", ",".join(map(str, prompts)), "-n", "0"]).stdout):
            out["prefill"][row["n_prompt"]] = row["avg_ts"]
    if n_dec:
        row = json.loads(run(lb + ["-p", "0", "-n", str(n_dec), "-d", str(depth)]).stdout)[0]
        out["decode_ms"] = 1e3 / row["avg_ts"]
    return out


def read_gbs(q3moe, threads, mb):
    """The host's plain memory read rate now (q3moe bench --membw, best of its passes over mb MiB). On
    shared VMs it switches between states minutes apart (on a Zen 4 here, 35 and 65 GB/s); a round whose
    two engines ran in different states does not compare."""
    with tempfile.TemporaryDirectory() as td:
        js = os.path.join(td, "m.json")
        run([q3moe, "bench", "--membw", "-t", str(threads), "--membw-mb", str(mb), "--json", js])
        with open(js) as f:
            return json.load(f)["membw"]["best_gbs"]


def probed(probe, bench):
    """bench() with the read rate just before and just after it, as its "reads"."""
    before = probe()
    out = bench()
    out["reads"] = [before, probe()]
    return out


def is_steady(rnd, factor):
    reads = rnd["llama.cpp"]["reads"] + rnd["q3moe"]["reads"]
    return max(reads) <= factor * min(reads)


def q3moe_bench(q3moe, model, threads, prompts, n_dec, depth, extra):
    with tempfile.TemporaryDirectory() as td:
        js = os.path.join(td, "b.json")
        run([q3moe, "bench", "-m", model, "-t", str(threads), "-r", "1", "-p", ",".join(map(str, prompts)) or "0",
             "-n", str(n_dec), "--depth", str(depth), "--no-ttft", "--no-membw", "--temp", "0", "--json", js] + extra)
        with open(js) as f:
            j = json.load(f)
    out = {"prefill": {p["tokens"]: p["tokens_per_s"] for p in j.get("prefill", [])}, "decode_ms": None,
           # how much of the weights had 2 MiB page entries (or huge pages): the page cache's state moves
           # a mapped decode's speed, so the rounds record it
           "pmd_gb": (j["huge_page_bytes"] if j["hugepages"] else j["file_pmd_mapped_bytes"]) / 1e9,
           "model_gb": j["model"]["bytes"] / 1e9}
    if n_dec:
        out["decode_ms"] = j["decode"]["ms_mean"]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", dest="model", required=True, help="Hugging Face checkpoint directory (Qwen3-MoE or Qwen3)")
    ap.add_argument("-p", dest="prompts", default="128,512", help="prompt lengths for prefill (default 128,512; 0 = none)")
    ap.add_argument("-n", dest="n_dec", type=int, default=64, help="decode steps (default 64; 0 = none)")
    ap.add_argument("--depth", type=int, default=128, help="tokens in the KV cache before decode (default 128)")
    ap.add_argument("-r", dest="rounds", type=int, default=3, help="alternating rounds per pair (default 3)")
    ap.add_argument("-t", dest="threads", type=int, default=os.cpu_count(), help="threads for both (default: all cores)")
    ap.add_argument("--pairs", default=None, help="bf16,bf16p,w4a8,w4a8i (default: bf16,w4a8 for MoE, bf16 for dense)")
    ap.add_argument("--work", default=os.path.join(ROOT, "build", "llama.cpp"), help="where llama.cpp and the "
                    "converted files go (default build/llama.cpp)")
    ap.add_argument("--no-llama-amx", dest="llama_amx", action="store_false", help="on AMX CPUs, build llama.cpp "
                    "without its AMX kernels (by default they are built, with a one-line fix; see BENCHMARKS.md)")
    ap.add_argument("--q3moe-opts", default="", help="more options for q3moe bench, e.g. --q3moe-opts=--hugepages "
                    "(with =, since they start with -)")
    ap.add_argument("--llama-opts", default="", help="more options for llama-bench, e.g. --llama-opts=\"-lm none\"")
    ap.add_argument("--steady", type=float, default=1.15, help="a round is steady when the host's read rates "
                    "measured before and after each engine's run are within this factor of each other (default "
                    "1.15); the table gives the speed-up over steady rounds too (0: no read probes)")
    ap.add_argument("--avx2", action="store_true", help="both engines with AVX2 + FMA only, as on an AVX2-only CPU: "
                    "llama.cpp built without -march=native, q3moe with Q3MOE_ISA=avx2")
    ap.add_argument("--json", help="also write the results as JSON (an existing file is refused unless --force)")
    ap.add_argument("--force", action="store_true", help="overwrite the --json file")
    a = ap.parse_args()

    try:
        prompts = [int(x) for x in a.prompts.split(",")]
    except ValueError:
        prompts = [-1]
    if any(n < 0 for n in prompts):
        fail(f"-p {a.prompts}: expected comma-separated token counts")
    prompts = [n for n in prompts if n > 0]
    for name, v, lo in (("-n", a.n_dec, 0), ("--depth", a.depth, 0), ("-r", a.rounds, 1), ("-t", a.threads, 1)):
        if v < lo:
            fail(f"{name} {v}: must be at least {lo}")
    if a.steady != 0 and not 1 <= a.steady <= 10:
        fail(f"--steady {a.steady}: a factor from 1 to 10, or 0 for no read probes")
    if not prompts and not a.n_dec:
        fail("nothing to measure: -p 0 and -n 0")
    try:
        q3moe_opts, llama_opts = shlex.split(a.q3moe_opts), shlex.split(a.llama_opts)
    except ValueError as e:
        fail(f"--q3moe-opts / --llama-opts: {e}")
    if a.json and os.path.exists(a.json) and not a.force:
        fail(f"--json {a.json} exists (--force overwrites it)")
    model = os.path.abspath(a.model)
    try:
        with open(os.path.join(model, "config.json")) as f:
            cfg = json.load(f)
    except (OSError, ValueError) as e:
        fail(f"-m {a.model}: {e}")
    if cfg.get("model_type") not in ("qwen3_moe", "qwen3"):
        fail(f"-m {a.model}: model_type {cfg.get('model_type')!r} in config.json; q3moe runs qwen3_moe and qwen3")
    moe = cfg["model_type"] == "qwen3_moe"
    pairs = (a.pairs or ("bf16,w4a8" if moe else "bf16")).split(",")
    for p in pairs:
        if p != "bf16" and p not in Q3M_PAIRS and p not in F16_PAIRS:
            fail(f"--pairs: unknown pair {p!r} ({PAIR_NAMES})")
        if p in Q3M_PAIRS and not moe:
            fail(f"--pairs {p}: needs a Qwen3-MoE checkpoint (llama.cpp's MXFP4_MOE quantizes experts)")
    q3moe = os.path.join(ROOT, "build", "q3moe")
    if not os.access(q3moe, os.X_OK):
        fail(f"{q3moe} not found: run make first")
    if a.avx2:
        if not {"avx2", "fma", "f16c"} <= cpu_flags():
            fail("--avx2: this CPU lacks AVX2, FMA or F16C")
        os.environ["Q3MOE_ISA"] = "avx2"  # every q3moe run below, the read probes too
    if not os.path.isfile(os.path.join(model, "tokenizer.json")):  # before the build: the GGUF needs it
        fail(f"-m {a.model}: no tokenizer.json; llama.cpp's GGUF carries the vocabulary, so the checkpoint needs "
             "one (`q3moe synth` copies it unless given --tokenizer none)")

    work = os.path.abspath(a.work)
    os.makedirs(os.path.join(work, "models"), exist_ok=True)
    jobs = os.cpu_count() or 1
    src = fetch_llama_source(work)
    bins, flags, build_note = build_llama(work, src, a.llama_amx, jobs, a.avx2)
    key = os.path.join(work, "models", checkpoint_key(model))
    size = checkpoint_bytes(model)
    gguf_py = os.path.join(src, "gguf-py")
    f16 = make_file(key + "-f16.gguf", "the F16 GGUF", size,
                    [sys.executable, os.path.join(ROOT, "tools", "hf_to_gguf.py"), model, "{out}", "--gguf-py", gguf_py])
    greedy_check(bins, f16, model, q3moe, a.threads)

    files = {"bf16": (f16, model)}
    for p, (extra, _) in F16_PAIRS.items():
        if p in pairs:
            opts = hashlib.sha1(" ".join(extra).encode()).hexdigest()[:8]
            files[p] = (f16, make_file(f"{key}-{p}-{opts}.q3m", f"q3moe's {p} file", size * 4 // 5,
                                       [q3moe, "convert", "-m", model, "-o", "{out}"] + extra))
    if any(p in Q3M_PAIRS for p in pairs):
        mx = make_file(key + "-mxfp4moe.gguf", "the MXFP4_MOE GGUF", size // 3,
                       [os.path.join(bins, "llama-quantize"), f16, "{out}", "MXFP4_MOE", str(jobs)], show=False)
        for p, (extra, _) in Q3M_PAIRS.items():
            if p in pairs:
                opts = hashlib.sha1(" ".join(extra).encode()).hexdigest()[:8]  # new options, new file
                q3m = make_file(f"{key}-{p}-{opts}.q3m", f"q3moe's {p} file", size // 3,
                                [q3moe, "convert", "-m", model, "-o", "{out}"] + extra)
                files[p] = (mx, q3m)

    results = {}
    for p in pairs:
        theirs, ours = files[p]
        read_through([theirs] + ([os.path.join(ours, f) for f in os.listdir(ours) if f.endswith(".safetensors")]
                                 if os.path.isdir(ours) else [ours]))
        rounds = []
        for r in range(a.rounds):
            log(f"{p}: round {r + 1}/{a.rounds}")
            run_l = lambda: llama_bench(bins, theirs, a.threads, prompts, a.n_dec, a.depth, llama_opts)  # noqa: E731
            run_q = lambda: q3moe_bench(q3moe, ours, a.threads, prompts, a.n_dec, a.depth, q3moe_opts)  # noqa: E731
            if a.steady:
                probe = lambda: read_gbs(q3moe, a.threads, 512)  # noqa: E731
                run_l = lambda f=run_l: probed(probe, f)  # noqa: E731
                run_q = lambda f=run_q: probed(probe, f)  # noqa: E731
            if r % 2 == 0:
                l, q = run_l(), run_q()
            else:
                q, l = run_q(), run_l()
            rounds.append({"llama.cpp": l, "q3moe": q})
        results[p] = rounds

    labels = {"bf16": ("F16", "BF16")}
    labels.update({p: ("MXFP4_MOE", label) for p, (_, label) in Q3M_PAIRS.items()})
    labels.update({p: ("F16", label) for p, (_, label) in F16_PAIRS.items()})
    print(f"q3moe vs llama.cpp {llama_release(work)} ({build_note}) on {cpu_name()}, {a.threads} threads, {a.model}"
          + (", q3moe with Q3MOE_ISA=avx2" if a.avx2 else ""))
    if q3moe_opts or llama_opts:
        print(f"q3moe bench {' '.join(q3moe_opts) or '(defaults)'}; llama-bench {' '.join(llama_opts) or '(defaults)'}")
    print(f"medians of {a.rounds} alternating rounds; the ratio range is over the rounds; decode is the mean "
          f"ms per token of {a.n_dec} steps after {a.depth} tokens\n")
    steady = {p: [r for r in rounds if a.steady and is_steady(r, a.steady)] for p, rounds in results.items()}
    if a.steady:
        print(f"steady rounds: the host's read rates before and after both engines' runs within {a.steady}x of "
              "each other\n")
    print("| pair | test | llama.cpp | q3moe | q3moe speed-up (range) |" + (" steady rounds: speed-up (n) |" if a.steady
                                                                            else ""))
    print("|---|---|---|---|---|" + ("---|" if a.steady else ""))
    summary = {}
    for p, rounds in results.items():
        lt, qt = labels[p]
        rows = [(f"prefill {n} (tok/s)", lambda s, n=n: s["prefill"][n], True) for n in prompts]
        if a.n_dec:
            rows.append((f"decode @{a.depth} (ms/token)", lambda s: s["decode_ms"], False))
        summary[p] = {}
        for test, get, higher_better in rows:
            lv = [get(x["llama.cpp"]) for x in rounds]
            qv = [get(x["q3moe"]) for x in rounds]
            sp = [(q / l) if higher_better else (l / q) for l, q in zip(lv, qv)]
            lm, qm = statistics.median(lv), statistics.median(qv)
            ratio = qm / lm if higher_better else lm / qm
            st = [(l / q if not higher_better else q / l) for l, q in
                  ((get(x["llama.cpp"]), get(x["q3moe"])) for x in steady[p])]
            cell = (f" {statistics.median(st):.2f}x ({len(st)}) |" if st else " none |") if a.steady else ""
            print(f"| {lt} vs {qt} | {test} | {lm:.2f} | {qm:.2f} | {ratio:.2f}x ({min(sp):.2f}-{max(sp):.2f}) |{cell}")
            summary[p][test] = {"llama.cpp": lv, "q3moe": qv, "speedup_of_medians": ratio}
            if a.steady:
                summary[p][test]["steady_speedup_median"] = statistics.median(st) if st else None
        summary[p]["q3moe_2mib_page_gb"] = [x["q3moe"]["pmd_gb"] for x in rounds]
        if a.steady:
            summary[p]["read_gbs"] = [{"llama.cpp": x["llama.cpp"]["reads"], "q3moe": x["q3moe"]["reads"]} for x in rounds]
            summary[p]["steady_rounds"] = [is_steady(x, a.steady) for x in rounds]
    print()
    for p, rounds in results.items():
        if a.steady:
            print(f"{labels[p][1]}: host read GB/s before-after llama.cpp / q3moe, by round: " + ", ".join(
                "{:.0f}-{:.0f} / {:.0f}-{:.0f}{}".format(*x["llama.cpp"]["reads"], *x["q3moe"]["reads"],
                                                         "" if is_steady(x, a.steady) else " (not steady)")
                for x in rounds))
    for p, rounds in results.items():
        gb = [x["q3moe"]["pmd_gb"] for x in rounds]
        print(f"{labels[p][1]}: q3moe's weights under 2 MiB pages, by round: "
              f"{', '.join(f'{g:.1f}' for g in gb)} of {rounds[0]['q3moe']['model_gb']:.1f} GB")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"llama_cpp_release": llama_release(work), "llama_cpp_cmake_flags": flags,
                       "llama_cpp_build": build_note, "q3moe_isa": os.environ.get("Q3MOE_ISA"), "cpu": cpu_name(),
                       "threads": a.threads,
                       "q3moe_opts": q3moe_opts, "llama_opts": llama_opts, "model": model, "depth": a.depth,
                       "decode_steps": a.n_dec, "rounds": a.rounds, "pairs": summary}, f, indent=1)


if __name__ == "__main__":
    main()
