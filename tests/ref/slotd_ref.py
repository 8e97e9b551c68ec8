#!/usr/bin/env python3
"""slotd_ref.py: an independent reference of the models of docs/models.md.

Written from the specification alone, in plain Python 3 (standard library
only), so that the C library can be checked against a second reading of the
same text.  Every floating-point sum is evaluated as docs/models.md writes it:
acc = 0.0, then acc += term, index ascending.  Python floats are IEEE-754
doubles, math.exp is the C library's exp, and math.sqrt is correctly
rounded, so the results are the specified bits.

Use as a module (Hash, Attn, make_model, generate) or run it: with no
arguments it checks the golden values of docs/models.md and exits 0 if they hold.
"""

import math
import sys

MASK = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def mix64(x):
    """splitmix64's output function."""
    z = (x + GOLDEN) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def round6(x):
    """Six decimals, as the logits leave the model."""
    return round(x, 6)


class Hash:
    """The `hash` family: one u64 contribution per position."""

    family = "hash"

    def __init__(self, vocab=1000, max_ctx=4096):
        self.vocab = vocab
        self.max_ctx = max_ctx
        self.layers = 1
        self.calls = 0  # calls of g

    def g(self, t, p):
        self.calls += 1
        return mix64(((t << 32) | p) & MASK)

    # A cache is the list of entries; the state is their running sum.
    def new_cache(self):
        return {"entries": [], "sum": 0}

    def run(self, cache, t):
        p = len(cache["entries"])
        e = self.g(t, p)
        cache["entries"].append(e)
        cache["sum"] = (cache["sum"] + e) & MASK

    def pick(self, cache):
        return cache["sum"] % self.vocab, None

    def next_token_from_scratch(self, tokens):
        s = 0
        for p, t in enumerate(tokens):
            s = (s + self.g(t, p)) & MASK
        return s % self.vocab, None


class Attn:
    """The `attn` family: L layers of one-head attention."""

    family = "attn"

    def __init__(self, vocab, d, layers, max_ctx, seed):
        self.vocab = vocab
        self.d = d
        self.layers = layers
        self.max_ctx = max_ctx
        self.seed = seed
        self.calls = 0  # calls of attend(): rows
        self._draw_index = 0
        self.E = self._matrix(vocab, d, 1.0)
        self.P = self._matrix(max_ctx, d, 1.0)
        scale = 1.0 / math.sqrt(d)
        self.W = []
        for _ in range(layers):
            wq = self._matrix(d, d, scale)
            wk = self._matrix(d, d, scale)
            wv = self._matrix(d, d, scale)
            wo = self._matrix(d, d, scale)
            self.W.append((wq, wk, wv, wo))
        self.U = self._matrix(d, vocab, scale)
        self.inv_sqrt_d = 1.0 / math.sqrt(d)

    def _weight(self, scale):
        i = self._draw_index
        self._draw_index += 1
        draw = mix64((self.seed + i * GOLDEN) & MASK)
        return (2.0 * ((draw >> 11) * 2.0**-53) - 1.0) * scale

    def _matrix(self, rows, cols, scale):
        return [[self._weight(scale) for _ in range(cols)] for _ in range(rows)]

    @staticmethod
    def _vecmat(x, w, cols):
        """out[j] = sum over i ascending of x[i] * w[i][j]."""
        out = []
        for j in range(cols):
            acc = 0.0
            for i in range(len(x)):
                acc += x[i] * w[i][j]
            out.append(acc)
        return out

    def _attend(self, q, keys, values):
        self.calls += 1
        d = self.d
        s = []
        for r in range(len(keys)):
            acc = 0.0
            kr = keys[r]
            for j in range(d):
                acc += q[j] * kr[j]
            s.append(acc * self.inv_sqrt_d)
        m = max(s)
        e = [math.exp(sr - m) for sr in s]
        z = 0.0
        for er in e:
            z += er
        a = []
        for j in range(d):
            acc = 0.0
            for r in range(len(values)):
                acc += (e[r] / z) * values[r][j]
            a.append(acc)
        return a

    # A cache holds K and V per layer and the logits of the last position.
    def new_cache(self):
        return {"K": [[] for _ in range(self.layers)],
                "V": [[] for _ in range(self.layers)],
                "len": 0, "logits": None}

    def run(self, cache, t):
        d = self.d
        p = cache["len"]
        x = [self.E[t][i] + self.P[p][i] for i in range(d)]
        for l in range(self.layers):
            wq, wk, wv, wo = self.W[l]
            q = self._vecmat(x, wq, d)
            k = self._vecmat(x, wk, d)
            v = self._vecmat(x, wv, d)
            cache["K"][l].append(k)
            cache["V"][l].append(v)
            a = self._attend(q, cache["K"][l], cache["V"][l])
            o = self._vecmat(a, wo, d)
            x = [x[j] + o[j] for j in range(d)]
        cache["logits"] = self._vecmat(x, self.U, self.vocab)
        cache["len"] = p + 1

    def pick(self, cache):
        logits = cache["logits"]
        best = 0
        for c in range(1, self.vocab):
            if logits[c] > logits[best]:
                best = c
        return best, logits

    def next_token_from_scratch(self, tokens):
        cache = self.new_cache()
        for t in tokens:
            self.run(cache, t)
        return self.pick(cache)


PRESETS = {
    "hash": lambda: Hash(1000, 4096),
    "tiny": lambda: Attn(6, 8, 2, 8, 1),
    "small": lambda: Attn(512, 64, 4, 1024, 2),
    "base": lambda: Attn(4096, 256, 8, 4096, 3),
}


def make_model(preset):
    return PRESETS[preset]()


def generate(model, tokens, steps, use_cache):
    """The input followed by `steps` greedy picks.

    Returns (tokens, logits, rows): `logits` holds, per pick, the unrounded
    logits behind it (attn) or None (hash); `rows` is the work done, counted
    by the model itself (attend() calls or g calls)."""
    before = model.calls
    seq = list(tokens)
    picks_logits = []
    if use_cache:
        if steps > 0:
            cache = model.new_cache()
            for t in seq:
                model.run(cache, t)
            for k in range(steps):
                tok, logits = model.pick(cache)
                seq.append(tok)
                picks_logits.append(logits)
                if k + 1 < steps:
                    model.run(cache, tok)
    else:
        for _ in range(steps):
            tok, logits = model.next_token_from_scratch(seq)
            seq.append(tok)
            picks_logits.append(logits)
    return seq, picks_logits, model.calls - before


class Sampler:
    """The sampler of docs/models.md ("Sampling") on one row of unrounded
    logits, for one temperature, top_k and top_p (not the greedy pick:
    temperature > 0 and top_k > 1).  The weights, the candidates and the
    nucleus depend on those alone; draw() then picks for a seed and a
    position."""

    def __init__(self, logits, temperature, top_k, top_p, order=None):
        v = len(logits)
        if order is None:
            order = sorted(range(v), key=lambda c: (-logits[c], c))
        cand = order[:min(top_k, v)]
        top = logits[order[0]]
        w = {}
        for c in cand:
            w[c] = math.exp((logits[c] - top) / temperature)
        z = 0.0
        for c in sorted(cand):
            z += w[c]
        if top_p < 1.0:
            bound = top_p * z
            nucleus = []
            acc = 0.0
            for c in cand:
                acc += w[c]
                nucleus.append(c)
                if acc >= bound:
                    break
        else:
            nucleus = cand
        self.nucleus = sorted(nucleus)
        self.weights = [w[c] for c in self.nucleus]
        zn = 0.0
        for x in self.weights:
            zn += x
        self.total = zn

    @staticmethod
    def unit(seed, position):
        """The draw for `position` from the stream of `seed`, in [0, 1)."""
        return (mix64((seed + position * GOLDEN) & MASK) >> 11) * 2.0 ** -53

    def draw(self, seed, position):
        target = self.unit(seed, position) * self.total
        acc = 0.0
        last = None
        for c, x in zip(self.nucleus, self.weights):
            acc += x
            if target < acc:
                return c
            if x > 0.0:
                last = c
        return last


def check_golden():
    """The golden values of docs/models.md; returns a list of failures."""
    bad = []
    if mix64(0) != 0xE220A8397B1DCDAF:
        bad.append("mix64(0) = %#x" % mix64(0))
    g10 = Hash().g(1, 0)
    if g10 != 0xC42C5A1AA3820138:
        bad.append("g(1, 0) = %#x" % g10)
    tiny = make_model("tiny")
    want_logits = [-0.215893, 0.026816, -0.396466, 0.115424, 0.344289, 0.245721]
    for use_cache, want_rows in ((True, 14), (False, 50)):
        toks, logits, rows = generate(tiny, [0, 1, 2], 5, use_cache)
        if toks != [0, 1, 2, 4, 0, 0, 0, 0]:
            bad.append("tiny tokens (cache %s) = %s" % (use_cache, toks))
        if rows != want_rows:
            bad.append("tiny rows (cache %s) = %d" % (use_cache, rows))
        first = [round6(x) for x in logits[0]]
        if first != want_logits:
            bad.append("tiny first logits (cache %s) = %s" % (use_cache, first))
    return bad


def main():
    bad = check_golden()
    for b in bad:
        print("golden value differs:", b)
    if bad:
        return 1
    print("slotd_ref: every golden value of docs/models.md holds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
