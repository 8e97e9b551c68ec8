#!/usr/bin/env python3
"""crosscheck.py: the C models against the independent Python reference.

Generates a seeded list of random generate() cases for hash, tiny and small,
feeds them to the C dump program (crosscheck_dump), and compares, case by
case, with tests/ref/slotd_ref.py:

- tokens and rows, cached and uncached;
- every unrounded logit behind every pick, bit for bit;
- every rounded logit, bit for bit against Python's round(x, 6), and its
  six-decimal string against printf("%.6f") on both sides;
- model_round6() against printf("%.6f") and round(x, 6) on some 15000
  chosen values, exact ties and near-ties among them;
- batches of small sequences stepped together (model_prefill(),
  model_pick_batch(), model_run_batch()): each sequence's picks and
  rounded logits against the reference run of that sequence alone;
- the sampler (model_sample_pick()) against slotd_ref.Sampler, pick for
  pick, on the unrounded logits of tiny, small and base sequences and on
  made-up rows full of ties, over temperatures 0.1 to 2, top_k and top_p
  each on and off, seeds across the whole 64-bit range: at least
  SAMPLE_PICKS_MIN picks.

A difference between Python's round(x, 6) and printf("%.6f") is reported
as such, apart from a model mismatch.  Exit status 0 when everything
agrees.  Standard library only.

Usage: crosscheck.py DUMP_PROGRAM [--seed N] [--small-cases N]
"""

import argparse
import json
import math
import os
import random
import struct
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "ref"))
import slotd_ref  # noqa: E402


def bits(x):
    return struct.pack("<d", x)


def make_cases(seed, small_cases):
    """(preset, tokens, steps, python_uncached) tuples, seeded."""
    rnd = random.Random(seed)
    cases = []
    # hash: sequences crossing several blocks (the first ones hold 30).
    for _ in range(40):
        total = rnd.randint(1, 300)
        n = rnd.randint(1, total)
        cases.append(("hash", [rnd.randrange(1000) for _ in range(n)], total - n, total <= 120))
    cases.append(("hash", [rnd.randrange(1000) for _ in range(4000)], 96, False))
    # tiny: the whole context.
    for _ in range(60):
        total = rnd.randint(1, 8)
        n = rnd.randint(1, total)
        cases.append(("tiny", [rnd.randrange(6) for _ in range(n)], total - n, True))
    # small: across its first blocks (1, 2, 3 positions), short enough for
    # Python; and one case into its blocks of 5, 7, 15 and 16.
    for i in range(small_cases):
        total = rnd.randint(1, 40)
        n = rnd.randint(1, total)
        cases.append(("small", [rnd.randrange(512) for _ in range(n)], total - n, i < 3 and total <= 12))
    cases.append(("small", [rnd.randrange(512) for _ in range(3)], 0, True))
    cases.append(("small", [rnd.randrange(512) for _ in range(170)], 6, False))
    return cases


class Report:
    def __init__(self):
        self.failures = []
        self.round_vs_printf = []

    def fail(self, where, what):
        if len(self.failures) < 50:
            self.failures.append("%s: %s" % (where, what))
        else:
            self.failures.append(None)


def check_logit(report, where, c_pair, py_raw, rounded):
    """c_pair: [printf %.6f, printf %a] from C; py_raw: Python's unrounded
    logit; rounded: True if the C value is the rounded one."""
    c_str, c_hex = c_pair
    c_val = float.fromhex(c_hex)
    py_round = slotd_ref.round6(py_raw)
    py_str = "%.6f" % py_raw
    if py_str != "%.6f" % py_round:
        report.round_vs_printf.append("%r: printf-style %s, round(x, 6) %r" % (py_raw, py_str, py_round))
    if rounded:
        if bits(c_val) != bits(py_round):
            report.fail(where, "rounded logit C %s (%s), Python round %r (%s)"
                        % (c_str, c_hex, py_round, py_round.hex()))
    else:
        if bits(c_val) != bits(py_raw):
            report.fail(where, "raw logit C %s, Python %s" % (c_hex, py_raw.hex()))
    if c_str != py_str:
        report.fail(where, "six decimals: C %s, Python %s" % (c_str, py_str))


def compare(report, models, case, c):
    preset, tokens, steps, py_uncached = case
    where = "%s %s+%d" % (preset, tokens[:6], steps)
    model = models[preset]
    if c["model"] != preset or c["input"] != tokens or c["steps"] != steps:
        report.fail(where, "the dump answered another case")
        return
    toks, logits, rows = slotd_ref.generate(model, tokens, steps, True)
    results = [("cached", c["cached"], rows)]
    if py_uncached:
        u_toks, u_logits, u_rows = slotd_ref.generate(model, tokens, steps, False)
        if u_toks != toks or u_logits != logits:
            report.fail(where, "the Python reference disagrees with itself (cached/uncached)")
        results.append(("uncached", c["uncached"], u_rows))
    else:
        u_rows = model.layers * sum(len(tokens) + k for k in range(steps))
        results.append(("uncached", c["uncached"], u_rows))
    for name, got, want_rows in results:
        if got["tokens"] != toks:
            report.fail(where, "%s tokens C %s, Python %s" % (name, got["tokens"], toks))
        if got["rows"] != want_rows:
            report.fail(where, "%s rows C %d, Python %d" % (name, got["rows"], want_rows))
        if model.family == "hash":
            if got["logits"]:
                report.fail(where, "%s: logits for hash" % name)
            continue
        if len(got["logits"]) != steps:
            report.fail(where, "%s: %d logit rows for %d steps" % (name, len(got["logits"]), steps))
            continue
        for k in range(steps):
            for v in range(model.vocab):
                check_logit(report, "%s %s pick %d logit %d" % (where, name, k, v),
                            got["logits"][k][v], logits[k][v], True)
    raw = c["raw"]
    if model.family == "attn":
        if len(raw) != steps:
            report.fail(where, "%d raw rows for %d steps" % (len(raw), steps))
            return
        for k in range(steps):
            for v in range(model.vocab):
                check_logit(report, "%s raw pick %d logit %d" % (where, k, v), raw[k][v], logits[k][v], False)


def make_batches(seed):
    """Batches of small sequences stepped together: (steps, [prompts])."""
    rnd = random.Random(seed + 2)
    out = []
    for k, steps in ((13, 4), (5, 3)):
        out.append((steps, [[rnd.randrange(512) for _ in range(rnd.randint(1, 12))]
                            for _ in range(k)]))
    return out


def compare_batch(report, model, batch, c):
    """Each sequence of a batch against the Python reference on its own."""
    steps, prompts = batch
    if c.get("batch") != "small" or c["steps"] != steps or len(c["seqs"]) != len(prompts):
        report.fail("batch", "the dump answered another batch")
        return 0
    compared = 0
    for b, (prompt, got) in enumerate(zip(prompts, c["seqs"])):
        where = "batch of %d, sequence %d %s+%d" % (len(prompts), b, prompt[:6], steps)
        toks, logits, _ = slotd_ref.generate(model, prompt, steps, True)
        if got["input"] != prompt or got["tokens"] != toks:
            report.fail(where, "tokens C %s, Python %s" % (got["tokens"], toks))
            continue
        for k in range(steps):
            for v in range(model.vocab):
                check_logit(report, "%s pick %d logit %d" % (where, k, v), got["logits"][k][v],
                            logits[k][v], True)
        compared += steps * model.vocab
    return compared


SAMPLE_PICKS_MIN = 100000
SAMPLE_TEMPS = (0.1, 0.3, 0.7, 1.0, 1.5, 2.0)
SAMPLE_TOPP = (1.0, 0.95, 0.8, 0.5, 0.1)


def sample_vectors(seed):
    """(line, draws per setting) of the vectors the sampler is run on: the
    logits after seeded prompts of each preset, and made-up rows with ties
    (values from a few, some far below the rest, so that weights
    underflow to 0)."""
    rnd = random.Random(seed + 3)
    out = []
    for preset, count, vocab, longest, draws in (("tiny", 6, 6, 7, 100), ("small", 6, 512, 20, 40),
                                                  ("base", 2, 4096, 5, 10)):
        for _ in range(count):
            prompt = [rnd.randrange(vocab) for _ in range(rnd.randint(1, longest))]
            out.append(("rawvec %s %s" % (preset, " ".join(map(str, prompt))), draws))
    for v in (8, 17, 64, 300):
        vals = [rnd.choice((0.5, 0.25, -1.0, 2.0, 2.0, 0.0, -0.0, -800.0, 2.0 - 2.0 ** -50))
                for _ in range(v)]
        out.append(("vec %s" % " ".join(x.hex() for x in vals), 50))
    return out


def sample_lines(seed, vectors):
    """The `sample` lines: for each vector, each setting, `draws` pairs."""
    rnd = random.Random(seed + 4)
    lines = []
    for vid, (_, draws) in enumerate(vectors):
        for t in SAMPLE_TEMPS:
            for k in ("off", 2, 10, 50):
                for p in SAMPLE_TOPP:
                    pairs = []
                    for i in range(draws):
                        s = (0, (1 << 64) - 1)[i] if i < 2 else rnd.getrandbits(64)
                        pairs.append((s, rnd.randrange(5000)))
                    lines.append((vid, t, k, p, pairs))
    return lines


def compare_samples(report, vectors, answers, lines, picks_answers):
    """Each pick of the C sampler against slotd_ref.Sampler."""
    rows = []
    for (line, _), ans in zip(vectors, answers):
        if "raw" in ans:
            rows.append([float.fromhex(x) for x in ans["raw"]])
        else:
            rows.append([float.fromhex(x) for x in line.split()[1:]])
            if ans.get("vec") != len(rows[-1]):
                report.fail("sample", "the dump kept another vector")
    orders = [sorted(range(len(r)), key=lambda c, r=r: (-r[c], c)) for r in rows]
    compared = 0
    for (vid, t, k, p, pairs), ans in zip(lines, picks_answers):
        row = rows[vid]
        top_k = len(row) if k == "off" else k
        sampler = slotd_ref.Sampler(row, t, top_k, p, orders[vid])
        got = ans["picks"]
        if len(got) != len(pairs):
            report.fail("sample", "%d picks for %d draws" % (len(got), len(pairs)))
            continue
        for (s, pos), c in zip(pairs, got):
            want = sampler.draw(s, pos)
            if c != want:
                report.fail("sample vector %d T %r top_k %s top_p %r seed %d position %d" %
                            (vid, t, k, p, s, pos), "C picks %d, Python %d" % (c, want))
        compared += len(pairs)
    return compared


def round6_values(seed):
    """Values for model_round6() against round(x, 6): the logits' range,
    exact ties (odd multiples of 1/128), near-ties a few ulps either side,
    tiny negatives that print as -0.000000, and the extremes."""
    rnd = random.Random(seed + 1)
    vals = [0.0, -0.0, -1e-9, 5e-7, -5e-7, 0.0078125, -0.0078125, 1e300, -1e300,
            5e-324, -5e-324, float("inf"), float("-inf"), float("nan")]
    for _ in range(3000):
        vals.append(rnd.uniform(-4.0, 4.0))
        vals.append(rnd.randrange(-2000001, 2000001, 2) / 128.0)
        near = (rnd.randrange(-10000000, 10000000) + 0.5) / 1e6
        toward = rnd.choice((-math.inf, math.inf))
        for _ in range(rnd.randrange(0, 5)):
            near = math.nextafter(near, toward)  # Python 3.9 or later
        vals.append(near)
        vals.append(-rnd.random() * 1e-6)
        vals.append(rnd.uniform(-1.0, 1.0) * 2.0 ** rnd.randrange(-60, 60))
    return vals


def check_round6(report, values, answers):
    for x, (c_str, c_hex) in zip(values, answers):
        c_round = float.fromhex(c_hex)
        where = "round6(%s)" % x.hex()
        if math.isnan(x):
            if not math.isnan(c_round) or c_str not in ("nan", "-nan"):
                report.fail(where, "C gives %s, %s" % (c_str, c_hex))
            continue
        py_str = "%.6f" % x
        py_round = slotd_ref.round6(x)
        if c_str != py_str:
            report.fail(where, "printf gives %s, Python %%-format %s" % (c_str, py_str))
        if bits(c_round) != bits(float(c_str)):
            report.fail(where, "model_round6 %s is not strtod(\"%s\")" % (c_hex, c_str))
        if bits(py_round) != bits(float(c_str)):
            report.round_vs_printf.append("%s: printf %s, round(x, 6) %r" % (x.hex(), c_str, py_round))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dump")
    ap.add_argument("--seed", type=int, default=20240611)
    ap.add_argument("--small-cases", type=int, default=25)
    args = ap.parse_args()

    golden = slotd_ref.check_golden()
    for g in golden:
        print("crosscheck: the reference misses a golden value:", g)
    if golden:
        return 1

    cases = make_cases(args.seed, args.small_cases)
    text = "".join("%s %d %s\n" % (p, s, " ".join(map(str, t))) for p, t, s, _ in cases)
    rvals = round6_values(args.seed)
    batches = [rvals[i:i + 1000] for i in range(0, len(rvals), 1000)]
    text += "".join("round6 %s\n" % " ".join(x.hex() for x in b) for b in batches)
    step_batches = make_batches(args.seed)
    text += "".join("batch small %d %d %s\n"
                    % (steps, len(ps), " ".join("%d %s" % (len(p), " ".join(map(str, p))) for p in ps))
                    for steps, ps in step_batches)
    vectors = sample_vectors(args.seed)
    slines = sample_lines(args.seed, vectors)
    text += "".join(line + "\n" for line, _ in vectors)
    text += "".join("sample %d %s %s %s %s\n"
                    % (vid, float(t).hex(), 1 << 40 if k == "off" else k, float(p).hex(),
                       " ".join("%d %d" % sp for sp in pairs))
                    for vid, t, k, p, pairs in slines)
    proc = subprocess.run([args.dump], input=text, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        print("crosscheck: %s failed (%d): %s" % (args.dump, proc.returncode, proc.stderr))
        return 1
    lines = proc.stdout.splitlines()
    sampled_at = len(cases) + len(batches) + len(step_batches)
    if len(lines) != sampled_at + len(vectors) + len(slines):
        print("crosscheck: %d cases, %d answers"
              % (sampled_at + len(vectors) + len(slines), len(lines)))
        return 1
    sample_answers = [json.loads(x) for x in lines[sampled_at:]]
    lines = lines[:sampled_at]

    models = {name: slotd_ref.make_model(name) for name in ("hash", "tiny", "small")}
    report = Report()
    logits_compared = 0
    for batch, line in zip(batches, lines[len(cases):]):
        check_round6(report, batch, json.loads(line)["round6"])
    batched = 0
    for batch, line in zip(step_batches, lines[len(cases) + len(batches):]):
        batched += compare_batch(report, models["small"], batch, json.loads(line))
    for case, line in zip(cases, lines):
        compare(report, models, case, json.loads(line))
        if case[0] != "hash":
            logits_compared += 3 * case[2] * models[case[0]].vocab

    picks = compare_samples(report, vectors, sample_answers[:len(vectors)], slines,
                            sample_answers[len(vectors):])
    if picks < SAMPLE_PICKS_MIN:
        report.fail("sample", "only %d picks compared, fewer than %d" % (picks, SAMPLE_PICKS_MIN))

    for r in report.round_vs_printf[:20]:
        print("crosscheck: Python round(x, 6) and printf differ:", r)
    shown = [f for f in report.failures if f is not None]
    for f in shown:
        print("crosscheck: MISMATCH", f)
    if len(report.failures) > len(shown):
        print("crosscheck: ... and %d more" % (len(report.failures) - len(shown)))
    print("crosscheck: %d cases (hash, tiny, small), %d logits, %d batched small logits, "
          "%d round6 values and %d sampled picks compared, %d mismatches, "
          "%d round/printf differences"
          % (len(cases), logits_compared, batched, len(rvals), picks, len(report.failures),
             len(report.round_vs_printf)))
    return 1 if report.failures or report.round_vs_printf else 0


if __name__ == "__main__":
    sys.exit(main())
