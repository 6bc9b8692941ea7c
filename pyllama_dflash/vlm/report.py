"""The ``vlm`` records as Markdown (docs/trained-target.md carries the committed ones').

A record's ``kind`` says which stage wrote it: ``judge`` (the differential and the captions), ``padded``
(a padded target's logits and batch costs) or ``drafts`` (the drafts' corpora and held-out acceptance).
"""

from __future__ import annotations

from ..figures import heading, table


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
            ["form", "layers", "FFN width", "weights", "core's weights", "logits against the core's, NMSE", "rows"],
            [
                [
                    r["form"],
                    str(p["n_layer"]),
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


def _with_interval(cell: dict) -> str:
    lo, hi = cell["ci95"]
    return f"{cell['mean']:.2f} [{lo:.2f}, {hi:.2f}]"


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def markdown(record: dict) -> str:
    body = {"judge": _judge, "padded": _padded, "drafts": _drafts}[record["kind"]](record)
    return "\n".join([heading(record), "", *body]) + "\n"
