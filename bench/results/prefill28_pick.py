"""prefill28's call: the t:G:N:D:T ways for prefill_bench from igemm_bench's JSON rows in a folder (gu32, gu64: pairx
gate/up at 32- and 64-row expert tiles; dn32, dn64: GGUF Q4_K down; dense: pairx qkv and o): per tile height the
fastest gate/up and down launches, scored as a layer runs them (2 gate/up + 1 down over the default's at 32 rows,
the lengths' ratios averaged); both heights' pairs, the better first; the better one again with the fastest dense
launch where that saves >= 3 % (qkv + o). "-": the default table's launch. Scores on stderr."""

import json
import sys


def rows(folder: str, name: str) -> dict:
    """{way: {(shape, tokens): us}} of one igemm_bench JSON (empty if it did not run)."""
    try:
        data = json.load(open(f"{folder}/igemm_{name}.json"))
    except (OSError, ValueError):
        return {}
    out = {}
    for r in data:
        out.setdefault(r["way"], {})[r["shape"], r["tokens"]] = r["us"]
    return out


def main(folder: str) -> str:
    gu = {32: rows(folder, "gu32"), 64: rows(folder, "gu64")}
    dn = {32: rows(folder, "dn32"), 64: rows(folder, "dn64")}
    dense = rows(folder, "dense")
    base_gu, base_dn = gu[32].get("s12"), dn[32].get("s12")
    if not base_gu or not base_dn:
        return ""
    toks = sorted({t for _, t in base_gu})
    pairs = []
    for h in (32, 64):
        for g, gt in gu[h].items():
            for d, dt in dn[h].items():
                if all((s, t) in gt for s, t in base_gu) and all((s, t) in dt for s, t in base_dn):
                    score = sum((2 * sum(gt[s, t] for s, u in base_gu if u == t) + sum(dt[s, t] for s, u in base_dn if u == t))
                                / (2 * sum(base_gu[s, t] for s, u in base_gu if u == t)
                                   + sum(base_dn[s, t] for s, u in base_dn if u == t)) for t in toks) / len(toks)
                    pairs.append((score, h, g, d))
    best = {}
    for score, h, g, d in sorted(pairs):
        best.setdefault(h, (score, h, g, d))
    print("pairs", sorted(pairs)[:8], file=sys.stderr)
    picked = sorted(best.values())
    lo = lambda w: "-" if w == "s12" else w  # noqa: E731
    ways = [f"t:{lo(g)}:{lo(d)}:-:{h}" for _, h, g, d in picked if (h, g, d) != (32, "s12", "s12")]
    if dense.get("s12"):
        ds = sorted((sum(v[k] for k in dense["s12"]) / sum(dense["s12"].values()), w) for w, v in dense.items()
                    if w != "s12" and set(v) >= set(dense["s12"]))
        print("dense", ds, file=sys.stderr)
        if ds and ds[0][0] < 0.97 and picked:
            _, h, g, d = picked[0]
            ways.append(f"t:{lo(g)}:{lo(d)}:{ds[0][1]}:{h}")
    return ",".join(ways)


if __name__ == "__main__":
    print(main(sys.argv[1]))
