"""The ``vlm`` records as Markdown (docs/trained-target.md carries the committed ones').

A record's ``kind`` says which stage wrote it: ``judge`` (the differential and the captions), ``probe``
(what a classifier reads of the shape from the projector's rows), ``padded``
(a padded target's logits and batch costs), ``drafts`` (the drafts' corpora and held-out acceptance) or
``vlm-speed`` (tokens/s with a draft over without through llama-server), ``vlm-paired`` (two of
those records' acceptance, paired) or ``vlm-accept`` (paired acceptance through the libraries, every
semantics).
"""

from __future__ import annotations

from ...figures import heading, table
from ..acceptance.paired import markdown as paired_markdown


def _judge(r: dict) -> list[str]:
    d = r["differential"]
    out = [
        f"`pyllama-dflash vlm judge --images {r['images']} --conversations {r['conversations']}` on "
        f"`{r['target']}`: llama.cpp's logits against the reference forward (F32 weights, llama.cpp's default "
        "F16 KV cache), then greedy captions of held-out images through mtmd.",
        "",
        table(
            ["rows compared", "text rows, NMSE (worst conversation)", "image rows, NMSE (worst conversation)"],
            [[str(d["rows"]), f"{d['text_nmse_max']:.2e}", f"{d['image_nmse_max']:.2e}"]],
        ),
        "",
        table(
            ["image rows", "images", "colour right", "shape right", "place right", "caption changes with the image"],
            [
                [rows, str(c["images"]), *(_pct(c[a]) for a in ("colour", "shape", "place", "changed_with_the_image"))]
                for rows, c in r["captions"].items()
            ],
        ),
        "",
        "Greedy replies, as written (held-out images; held-out topics):",
        "",
        "```",
    ]
    for c in r["captions"].values():
        out += [f"[{s['caption']}] -> {s['reply']}" for s in c["samples"][:3]]
    out += [f"Tell me about {s['subject']}. -> {s['reply']}" for s in r["replies"]]
    return [*out, "```"]


def _padded(r: dict) -> list[str]:
    p = r["padded"]["config"]
    return [
        table(
            [
                "form",
                "layers",
                "width",
                "FFN width",
                "weights",
                "core's weights",
                "logits against the core's, NMSE",
                "rows",
            ],
            [
                [
                    r["form"],
                    str(p["n_layer"]),
                    str(p["n_embd"]),
                    str(p["n_ff"]),
                    f"{r['weight_bytes'] / 2**20:.0f} MiB",
                    f"{r['core_weight_bytes'] / 2**20:.1f} MiB",
                    f"{r['logits_nmse_against_core']:.2e}",
                    str(r["rows_compared"]),
                ]
            ],
        ),
    ]


def _drafts(r: dict) -> list[str]:
    rows = []
    for d in r["drafts"]:
        c = d["corpus"]
        rows.append(
            [
                d["trained_on"],
                f"{c['train']} / {c['held_out']}",
                ", ".join(str(x) for x in c["image_rows"]) or "none",
                f"0..{d['positions_covered'][1]}",
                str(d["recipe"]["steps"]),
                f"{d['history'][-1]['loss']:.3f}",
                _with_interval(d["held_out_accepted_by_n_max"]["3"]),
                _with_interval(d["held_out_accepted_by_n_max"][str(d["block_size"] - 1)]),
            ]
        )
    return [
        "`pyllama-dflash vlm drafts`: accepted tokens a round on held-out conversations, the reference draft "
        "fed llama.cpp's features (draftmodel/evaluate.py):",
        "",
        table(
            [
                "trained on",
                "conversations (train / held out)",
                "image rows",
                "rows trained at",
                "steps",
                "final loss",
                "accepted of 3",
                "accepted of 7",
            ],
            rows,
        ),
    ]


def _ratio(cell: dict | None) -> str:
    if not cell:
        return ""
    lo, hi = cell["ci95"]
    return f"{cell['ratio']:.2f} [{lo:.2f}, {hi:.2f}]"


def _speed_notes(r: dict) -> tuple[str, list[str]]:
    """How many replies with the draft differ from those without it, per n_max; and each after-image
    phase's ratio over the text ratio (named by its n_max where the record holds several)."""
    plain = r["turns"]["no draft"]
    differ = ", ".join(
        f"{sum(t['reply'] != p['reply'] for t, p in zip(r['turns'][f'n_max {n}'], plain, strict=True))} of "
        f"{len(plain)} at n_max {n}"
        for n in r["table"]
    )
    several = len(r["table"]) > 1
    after_image = [
        (f"n_max {n} " if several else "") + f"{phase} {_ratio(cell)}"
        for n, e in r["table"].items()
        for phase, cell in e["ratio_of_text"].items()
    ]
    return differ, after_image


def _speed(r: dict) -> list[str]:
    rows = []
    for n_max, entry in r["table"].items():
        for phase, cell in entry["phases"].items():
            tok_s, a, c = cell["tok_s"], cell["accepted_per_round"], cell["implied_round_cost"]
            rows.append(
                [
                    n_max,
                    phase,
                    f"{tok_s['without_draft_tok_s']:.1f}" if tok_s else "",
                    f"{tok_s['with_draft_tok_s']:.1f}" if tok_s else "",
                    _ratio(tok_s),
                    _ratio(cell["ttft"]),
                    "" if a is None else f"{a:.2f}",
                    "" if c is None else f"{c:.2f}",
                    "" if c is None else f"{cell['accepted_needed_for_1_5x']:.2f}",
                ]
            )
    files = r["files"]
    differ, after_image = _speed_notes(r)
    return [
        f"`{r['command']}`: target `{files['target']['name']}`, draft `{files['draft']['name']}`, variant "
        f"`{r['variant']}`, {r['conversations']} held-out {r['conversation_kind']} conversations"
        + (f" with images of {r['rows']} rows" if r.get("rows") else "")
        + f"; replies with the draft that differ from the reply without it: {differ}.",
        "",
        table(
            [
                "n_max",
                "phase",
                "tokens/s without",
                "with",
                "with / without",
                "time to first token, with / without",
                "accepted a round (a)",
                "round cost implied (c)",
                "a for 1.5x at that c",
            ],
            rows,
        ),
        *(
            [
                "",
                "Each phase's tokens/s ratio over the text turns' ratio, the same conversations resampled for both: "
                + "; ".join(after_image)
                + ".",
            ]
            if after_image
            else []
        ),
    ]


def _paired(r: dict) -> list[str]:
    rows = []
    for phase, d in r["phases"].items():
        lo, hi = d["ci95"]
        cell = f"{d['difference']:+.2f} [{lo:+.2f}, {hi:+.2f}]"
        rows.append([phase, f"**{cell}**" if d["told_apart"] else cell])
    return [
        f"`{r['command']}`: draft `{r['draft']}`, accepted tokens a round under `{r['first']['variant']}` minus "
        f"under `{r['second']['variant']}` (n_max {r['n_max']}), paired over conversations; the replies were "
        f"the same in {r['same_replies']} of {r['turns']} turns (bold: the interval excludes 0):",
        "",
        table(["phase", f"{r['first']['variant']} - {r['second']['variant']}"], rows),
    ]


def _with_interval(cell: dict) -> str:
    lo, hi = cell["ci95"]
    return f"{cell['mean']:.2f} [{lo:.2f}, {hi:.2f}]"


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _accept(r: dict) -> list[str]:
    return [
        f"`{r['command']}`: {r['conversations']} held-out conversations, n_max {r['n_max']}, each column's "
        "replies the same target tokens (checked), a position's phase by its place in its reply "
        "(`~`: the interval holds 0).",
        "",
        paired_markdown(r["runs"]),
    ]


def _probe(r: dict) -> list[str]:
    accuracy = r["held_out_shape_accuracy"]
    counts = sorted({n for by_seeds in accuracy.values() for n in by_seeds}, key=int)
    c = r["classifier"]
    return [
        f"`{r['command']}`: the shape of {r['held_out_per_scene']} held-out images of each of the 90 scenes, "
        f"named by a kernel ridge classifier (RBF, gamma {c['gamma_times_features']} / features, ridge {c['ridge']}) "
        "trained on the projector's rows of every scene at the first N training seeds.",
        "",
        table(
            ["image rows", *(f"{n} seeds" for n in counts)],
            [
                [rows, *(_pct(by_seeds[n]) if n in by_seeds else "" for n in counts)]
                for rows, by_seeds in accuracy.items()
            ],
        ),
    ]


def markdown(record: dict) -> str:
    body = {
        "judge": _judge,
        "probe": _probe,
        "padded": _padded,
        "drafts": _drafts,
        "vlm-speed": _speed,
        "vlm-paired": _paired,
        "vlm-accept": _accept,
    }[record["kind"]](record)
    return "\n".join([heading(record), "", *body]) + "\n"
