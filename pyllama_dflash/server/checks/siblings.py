"""The sibling drafters through llama-server after an image: draft-mtp (the target's own MTP head, no
draft file) and draft-eagle3. Measurements of b11434 with and without the series (which changes
neither drafter): the expectations below are what was measured, written down so that a change shows.
"""

from __future__ import annotations

from .. import bodies
from ..expect import Expect, Result, Seen, judged
from . import check, server_facts


def _image_turns(ctx, name: str) -> Result:
    """A text request (the draft's statistics before any image), an image request with and without the
    draft (exactness), a second turn after the image, then a slot save, another conversation and the
    restore with the first conversation continued."""
    save_dir = ctx.work_dir / f"{name}-slots"
    save_dir.mkdir(parents=True, exist_ok=True)
    with ctx.server(name, n_parallel=1, slot_save_path=save_dir, cache_ram_mib=0) as srv:
        text = srv.completion(bodies.RAW_TEXT_PROMPT, n_predict=bodies.N_PREDICT, cache_prompt=False)
        image_prompt = srv.multimodal_prompt(bodies.RAW_IMAGE_PROMPT, [ctx.image()])
        image = srv.completion(image_prompt, n_predict=bodies.N_PREDICT, cache_prompt=False)
        first = bodies.image_message(ctx.image())
        turn1 = srv.chat([first], max_tokens=bodies.N_PREDICT)
        turn2 = srv.chat(bodies.two_turn(first, turn1.content or "It is a picture."), max_tokens=bodies.N_PREDICT)
        a = srv.post("/tokenize", {"content": bodies.RESTORE_A, "add_special": True}).body.get("tokens", [])
        ra = srv.completion(a, n_predict=bodies.N_PREDICT)
        save = srv.post("/slots/0?action=save", {"filename": "s.bin"})
        srv.completion(bodies.SHORT_TEXT, n_predict=bodies.N_PREDICT)
        restore = srv.post("/slots/0?action=restore", {"filename": "s.bin"})
        more = srv.post("/tokenize", {"content": bodies.RESTORE_MORE, "add_special": False}).body.get("tokens", [])
        last = srv.completion(a + (ra.tokens or []) + more, n_predict=bodies.N_PREDICT)
        facts = server_facts(srv)
    with ctx.server(name + "_no_draft", draft=False) as srv:
        image_ref = srv.completion(
            srv.multimodal_prompt(bodies.RAW_IMAGE_PROMPT, [ctx.image()]),
            n_predict=bodies.N_PREDICT,
            cache_prompt=False,
        )
        last_ref = srv.completion(a + (ra.tokens or []) + more, n_predict=bodies.N_PREDICT)
    responses = [text, image, turn1, turn2, ra, save, restore, last]
    exact = {
        "image": image.ok and image_ref.ok and image.tokens == image_ref.tokens,
        "restored": last.ok and last_ref.ok and last.tokens == last_ref.tokens,
    }
    seen = Seen(responses, same_tokens=all(exact.values()))
    return judged(
        ctx.expect(name),
        seen,
        exact=exact,
        draft={
            "text_before_any_image": text.draft_stats,
            "image": image.draft_stats,
            "second_turn_after_the_image": turn2.draft_stats,
            "restored_text": last.draft_stats,
        },
        **facts,
    )


# MTP skips embedding batches in process() ("TODO: how to make it work with vision tokens?"); its
# context is the target's own (IMROPE), whose batch check lets the text after an image jump: measured,
# every request answers 200 with the target's own tokens, on every variant
@check("mtp_image_turns", sibling="mtp", fix=Expect(200, "every", same_tokens=True))
def mtp_image_turns(ctx) -> Result:
    """draft-mtp over the target's MTP head: text, an image, two turns, a slot restore."""
    return _image_turns(ctx, "mtp_image_turns")


# EAGLE3 skips embedding batches too, and its draft is never M-RoPE (b11434 gives eagle3 the plain rope
# and reads no rope sections): the text after an image is refused (Y = X + 1), on every variant, since
# the series changes only DFlash's code. Measured: the image request answers 500.
@check("eagle3_image_turns", sibling="eagle3", baseline=Expect(500, "any"), fix=Expect(500, "any"))
def eagle3_image_turns(ctx) -> Result:
    """draft-eagle3: text, an image, two turns, a slot restore."""
    return _image_turns(ctx, "eagle3_image_turns")
