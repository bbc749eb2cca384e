#!/usr/bin/env bash
# Seeded command-line fuzzing of the real binary: random bad flag values and
# mutated / hostile input files on the fast commands (params, topology,
# validate-config, predict, goodput, sweep). Every run must exit 0 or 2
# (never a signal, never 1), finish within its time limit, and print no
# nan / inf when it exits 0. The in-process JSON fuzzing is tests/fuzz_json.cpp.
#
#   bash tests/cli/fuzz.sh build/rackstep                 # CI: 80 runs, seed 1
#   FUZZ_RUNS=5000 FUZZ_SEED=9 bash tests/cli/fuzz.sh build/rackstep
set -u
bin=${1:?usage: fuzz.sh path/to/rackstep}
exec python3 - "$bin" <<'PY'
import json, os, random, re, shutil, signal, subprocess, sys, tempfile

binary = sys.argv[1]
runs = int(os.environ.get("FUZZ_RUNS", "80"))
seed = int(os.environ.get("FUZZ_SEED", "1"))
rng = random.Random(seed)
tmp = tempfile.mkdtemp(prefix="rackstep-fuzz-")

models = sorted("models/zoo/" + f for f in os.listdir("models/zoo") if f.endswith(".json"))
# Cluster files name their system file relative to themselves: mutated ones sit beside copies of the zoo.
shutil.copytree("topologies/zoo", os.path.join(tmp, "topologies"))
clusters = [os.path.join(tmp, "topologies", f) for f in ["gb200-11-racks.json", "gb200-nvl72.json", "hgx-h100.json"]]
layouts = sorted("sim/layouts/" + f for f in os.listdir("sim/layouts") if f.endswith(".json"))
bad_values = ["nan", "-nan", "inf", "-inf", "-1", "0", "1e400", "1e300", "-1e300", "1e-300", "4294967297",
              "99999999999999999999999", "", "abc", "0x10", "1.5", "100000", "2147483648", "-2147483649", " 3"]

def extreme():
    return rng.choice([0, -1, 1, 3, 1e308, -1e308, 1e-308, 0.5, 2**31, 2**63 - 1, 1e9, 4e9, 1e15, "", "x", None,
                       True, [], {}, [1, 2, 3]])

def mutate(doc):
    node, parent, key = doc, None, None
    for _ in range(rng.randint(0, 5)):
        if isinstance(node, dict) and node:
            key = rng.choice(list(node)); parent, node = node, node[key]
        elif isinstance(node, list) and node:
            key = rng.randrange(len(node)); parent, node = node, node[key]
        else:
            break
    if parent is None:
        return doc
    op = rng.randrange(4)
    if op == 0:
        parent[key] = extreme()
    elif op == 1 and isinstance(parent, dict):
        del parent[key]
    elif op == 2:
        v = parent[key]
        for _ in range(rng.randint(1, 80)):
            v = [v]
        parent[key] = v
    else:
        parent[key] = node * 1000 if isinstance(node, (int, float)) and not isinstance(node, bool) else extreme()
    return doc

def hostile_file(kind_files):
    r = rng.randrange(10)
    if r == 0:
        return "/dev/zero"
    if r == 1:
        return os.path.join(tmp, "no-such-file.json")
    if r == 2:
        return tmp  # a directory
    if r == 3:
        p = os.path.join(tmp, "deep-%d.json" % rng.randrange(10**9))
        open(p, "w").write("[" * 100000 + "]" * 100000)
        return p
    if r == 4:
        return os.path.join(tmp, "n" * 300 + ".json")
    src = rng.choice(kind_files)
    doc = json.load(open(src))
    for _ in range(rng.randint(1, 3)):
        doc = mutate(doc)
    p = os.path.join(os.path.dirname(src) if src.startswith(tmp) else tmp, "fuzz-%d.json" % rng.randrange(10**9))
    text = json.dumps(doc)
    if rng.randrange(6) == 0:
        text = text[: rng.randrange(len(text) + 1)]
    open(p, "w").write(text)
    return p

def command():
    c = rng.choice(["params", "topology", "validate-config", "predict", "goodput", "sweep"])
    v = lambda: rng.choice(bad_values) if rng.randrange(3) else str(rng.choice([1, 2, 4, 8, 64, 4096]))
    if c == "params":
        args = [c, hostile_file(models) if rng.randrange(2) else rng.choice(models)]
        if rng.randrange(2): args += ["--seq", v()]
    elif c == "topology":
        args = [c, hostile_file(clusters) if rng.randrange(2) else rng.choice(clusters)]
        if rng.randrange(2): args += ["--domains", v()]
    elif c == "validate-config":
        args = [c] + [hostile_file(models + clusters) for _ in range(rng.randint(1, 3))]
    elif c == "predict":
        m, cl, l = "models/zoo/marin-535b-a23b.json", clusters[0], "sim/layouts/hero-ragged.json"
        which = rng.randrange(4)
        if which == 0: m = hostile_file(models)
        elif which == 1: cl = hostile_file(clusters)
        elif which == 2: l = hostile_file(layouts)
        args = [c, "--model", m, "--cluster", cl, "--layout", l]
        if which == 3: args += ["--domains", v()]
    elif c == "goodput":
        flags = {"--step-time-s": "17", "--tokens-per-step": "46137344", "--tokens": "18e12", "--gpus": "704",
                 "--params": "535e9", "--runs": "20"}
        for f in rng.sample(list(flags) + ["--deadline-days", "--bins", "--checkpoint-interval-s"], rng.randint(1, 2)):
            flags[f] = v() if f != "--runs" else rng.choice(["20", "0", "-5", "nan", "1e400", "100000000"])
        args = [c] + [x for kv in flags.items() for x in kv]
    else:
        args = [c, "--model", "models/zoo/marin-67b-a2b.json", "--cluster", clusters[1]]
        f = rng.choice(["--top", "--threads", "--domains", "--tokens-per-step"])
        args += [f, v()]
        if rng.randrange(3) == 0: args[2] = hostile_file(models)
    if rng.randrange(3) == 0: args.append("--json")
    return args

nonfinite = re.compile(r"(?<![A-Za-z_])-?(nan|inf)(?![A-Za-z_])", re.I)
failures = 0
try:
    for i in range(runs):
        args = command()
        try:
            p = subprocess.run([binary] + args, capture_output=True, timeout=30)
        except subprocess.TimeoutExpired:
            print("FAIL (hang > 30 s): %s" % " ".join(args)); failures += 1; continue
        out = p.stdout.decode(errors="replace"); err = p.stderr.decode(errors="replace")
        problem = None
        if p.returncode < 0:
            problem = "killed by %s" % signal.Signals(-p.returncode).name
        elif p.returncode not in (0, 2):
            problem = "exit %d" % p.returncode
        elif p.returncode == 0 and nonfinite.search(out):
            problem = "nan/inf in the output: %s" % nonfinite.search(out).group(0)
        elif p.returncode == 2 and not err.strip() and not out.strip():
            problem = "exit 2 with nothing said"  # (an invalid layout or --json report goes to stdout)
        if problem:
            failures += 1
            print("FAIL run %d (seed %d): %s: %s\n  stderr: %s" % (i, seed, problem, " ".join(args), err[-400:]))
finally:
    shutil.rmtree(tmp, ignore_errors=True)
print("fuzz: %d runs, seed %d, %d failures" % (runs, seed, failures))
sys.exit(1 if failures else 0)
PY
