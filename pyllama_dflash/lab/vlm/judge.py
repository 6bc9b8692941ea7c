"""The trained target judged on llama.cpp: the differential against the reference forward, the
captions of held-out images, and a few greedy replies for the docs.

Held-out means never trained on: paragraphs in the held-out split (prose.py) and image seeds from
HELD_OUT_IMAGE_SEEDS (the pool's seeds are below them).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from .corpus import Image, draw_conversation, render
from .evaluate import caption_scores, greedy_captions, greedy_reply, llama_logits, nmse, reference_logits
from .imagerows import encode_images
from .pipeline import HELD_OUT_IMAGE_SEEDS
from .prose import all_paragraphs, topic_paragraphs
from .scenes import SIDE_FOR_ROWS, all_scenes
from .weights import read_target

CAPTION_ROWS = tuple(SIDE_FOR_ROWS)  # every size the bench serves
DIFFERENTIAL_ROWS = (9, 64, 256)  # a conversation of each kind: prose, mixed, caption


def differential(target: Path, mmproj: Path, n_conversations: int) -> dict:
    """NMSE of llama.cpp's logits against the reference's, text rows and image rows apart."""
    cfg, params = read_target(target)
    held = [p for p in topic_paragraphs() if p.held_out]
    rng = np.random.default_rng([7, 59])
    text_err, image_err, rows = [], [], 0
    for k in range(n_conversations):
        kind = ("prose", "mixed", "caption")[k % 3]
        conv = draw_conversation(kind, rng, held, DIFFERENTIAL_ROWS[k % 3], HELD_OUT_IMAGE_SEEDS)
        encoded = encode_images(target, mmproj, [t.image for t in conv if t.image is not None])
        grid = {key[3]: (nx, ny) for key, (_r, nx, ny) in encoded.items()}
        rendered = render(conv, grid)
        rows_of = {key: r for key, (r, _nx, _ny) in encoded.items()}
        got = llama_logits(target, rendered, rows_of)
        want = reference_logits(cfg, params, rendered, rows_of)
        image = rendered.tokens < 0
        text_err.append(nmse(got[~image], want[~image]))
        if image.any():
            image_err.append(nmse(got[image], want[image]))
        rows += rendered.n
    return {"rows": rows, "text_nmse_max": max(text_err), "image_nmse_max": max(image_err) if image_err else None}


def held_out_images(n: int, rows: int) -> list[Image]:
    scenes = all_scenes()
    return [Image(scenes[k % len(scenes)], SIDE_FOR_ROWS[rows], HELD_OUT_IMAGE_SEEDS[k % 100]) for k in range(n)]


def chat_scenes() -> dict[str, Image]:
    """Two held-out scenes of 64 rows apart in colour and place (a red square at the left, a green
    square at the right): the images of the operator's chat and of repro on the trained pair, by file name."""
    images = held_out_images(40, 64)
    return {f"scene-{k}.png": images[k] for k in (7, 23)}


def captions(target: Path, mmproj: Path, n_images: int) -> dict:
    out = {}
    for rows in CAPTION_ROWS:
        images = held_out_images(n_images, rows)
        results = greedy_captions(target, mmproj, images)
        # the next image is another scene: does the caption change with it?
        changed = [
            a.reply != b.reply for a, b in zip(results, results[1:], strict=False) if a.image.scene != b.image.scene
        ]
        out[str(rows)] = caption_scores(results) | {
            "images": len(images),
            "changed_with_the_image": sum(changed) / max(len(changed), 1),
            "samples": [{"caption": r.image.scene.caption(), "reply": r.reply} for r in results[::17][:6]],
        }
    return out


def judge(
    target: Path, mmproj: Path, *, n_images: int, n_conversations: int, log: Callable[[str], None] = print
) -> dict:
    report = {"target": target.name}
    report["differential"] = differential(target, mmproj, n_conversations)
    log(f"differential: {report['differential']}")
    report["captions"] = captions(target, mmproj, n_images)
    for rows, c in report["captions"].items():
        log(f"captions at {rows} rows: colour {c['colour']:.2f}, shape {c['shape']:.2f}, place {c['place']:.2f}")
    held = list({p.subject: p for p in all_paragraphs(limit_files=0) if p.held_out}.values())[:4]  # four topics
    report["replies"] = [
        {"subject": p.subject, "reply": greedy_reply(target, f"Tell me about {p.subject}.")} for p in held
    ]
    return report
