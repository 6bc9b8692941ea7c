"""The MTP heads other than Qwen3.5's one head, after an image, judged against the definition.

libcommon's MTP driver knows two more kinds of head: a chain, one head per drafted token (Step 3.5,
``chain_heads``), and an assistant that reads the target's memory and decodes no rows of its own (Gemma
4's, ``is_mem_shared``). Both targets are NEOX, so an image's rows take one position each.

The reference is the definition itself: an image whose rows are the input embeddings of some tokens is,
to the target and to its head, those tokens. So a conversation with such an image must draft exactly what
the same conversation with the tokens drafts, and its draft memory must end where the other's does: right
after the image (the head's state is then the image's last row's) and after text that follows it.

``run(variant)`` runs every case in a child (a native abort is reported, not fatal) and returns what each
found; ``first_failure`` says where a variant falls short of the definition. ``python -m
pyllama_dflash.harness.oracles.mtp_heads VARIANT`` is the child: it loads the variant as ``$PYLLAMA_DFLASH_PATCHES``
(or the checkout's series) has it, so a mutant's series is judged the same way.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np

from ..tiny import gguf_module

# "<head>, text after: <bool>": each head right after the image, and with text after it
CASES = tuple(f"{head}, text after: {after}" for head in ("chained", "assistant") for after in (False, True))


def run(variant: str, timeout: float = 240) -> dict:
    """Every case on the variant, in a child: {case: {"image": found, "tokens": found}}, or {"error": ...}
    when the child did not finish (a native abort, say)."""
    cmd = [sys.executable, "-m", __name__, variant]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    if proc.returncode != 0:
        return {"error": f"exit {proc.returncode}: {proc.stderr[-1500:]}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def first_failure(found: dict) -> str | None:
    """Where the variant's runs differ from the definition's, or None: every call succeeds, and with the
    image the head drafts what it drafts with the tokens, its memory ending at the same position."""
    if "error" in found:
        return found["error"]
    for case in CASES:
        image, tokens = found[case]["image"], found[case]["tokens"]
        if not all(image["calls"]):
            return f"{case}: a call failed ({image['calls']}): {' '.join(image['log'])[-300:]}"
        if not image["drafted"] or image["drafted"] != tokens["drafted"]:
            return f"{case}: drafted {image['drafted']} after the image, {tokens['drafted']} after the tokens"
        if image["draft_pos_max"] != tokens["draft_pos_max"]:
            return f"{case}: the draft's memory ends at {image['draft_pos_max']}, not {tokens['draft_pos_max']}"
    return None


def token_embeddings(path) -> np.ndarray:
    """A model's token embedding table as its GGUF file holds it, ``[n_vocab, n_embd]``."""
    table = next(t for t in gguf_module().GGUFReader(path).tensors if t.name == "token_embd.weight")
    return np.asarray(table.data, dtype=np.float32).reshape(-1, int(table.shape[0]))


def _conversation(api, tm, embd: np.ndarray, head, image: bool, text_after: bool) -> dict:
    """Text, then four tokens or an image of their rows of ``embd`` (their input embeddings), then text or
    nothing; then a draft at the next position."""
    target = api.Context(tm, n_ctx=128, n_batch=64, n_ubatch=64)
    draft = head(target)
    spec = api.Speculative(target, draft, n_max=3, spec_type="draft-mtp", backend_sampling=False)
    words = lambda text: [int(t) for t in tm.tokenize(text, add_special=False)]
    first, middle, last = words("tree blue moon rock fish lamp "), words("star wind snow rain"), words("sun cat")
    p1, p2 = len(first), len(first) + len(middle)
    passes = [api.Batch.tokens(first, pos0=0)]
    if image:
        rows = np.ascontiguousarray(embd[middle])
        passes.append(api.Batch.embeddings(rows, np.arange(p1, p2, dtype=np.int32)[None], logits="last"))
    else:
        passes.append(api.Batch.tokens(middle, pos0=p1))
    if text_after:
        passes.append(api.Batch.tokens(last, pos0=p2))
    calls = [target.process_rc(batch) == 0 and spec.process_ok(batch) for batch in passes]
    found = {"calls": calls, "log": [str(x) for x in spec.last_log]}
    found["drafted"] = spec.draft(0, target.argmax(-1), target.pos_max(0) + 1)
    found["draft_pos_max"] = draft.pos_max(0)
    for owner in (spec, draft, target):
        owner.close()
    return found


def main(variant: str) -> None:
    from pyllama_dflash import load
    from pyllama_dflash.harness.tiny import gemma4, step35
    from pyllama_dflash.paths import cache_root
    from pyllama_dflash.product import api

    load(variant)
    folder = cache_root() / "tiny" / "seed0"
    chained = step35.write(folder)
    target_file, assistant_file = gemma4.write_pair(folder)
    forms = ("image", "tokens")
    out: dict[str, dict] = {}
    with api.Model(chained, load_mtp=True) as tm:
        embd = token_embeddings(chained)
        for after in (False, True):
            out[f"chained, text after: {after}"] = {
                form: _conversation(api, tm, embd, api.Context.mtp, form == "image", after) for form in forms
            }
    with api.Model(target_file) as tm, api.Model(assistant_file) as am:
        embd = token_embeddings(target_file) * math.sqrt(tm.n_embd)  # Gemma scales a token's by sqrt(n_embd)
        assistant = lambda t: api.Context.assistant(am, t)
        for after in (False, True):
            out[f"assistant, text after: {after}"] = {
                form: _conversation(api, tm, embd, assistant, form == "image", after) for form in forms
            }
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
