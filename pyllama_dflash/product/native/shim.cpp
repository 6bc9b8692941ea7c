// pyllama_dflash_shim: extern "C" wrappers over llama.cpp b11434's C++-only surface.
// See pyllama_dflash_shim.h for the contract. Nothing here may let a C++ exception out.

#include "pyllama_dflash_shim.h"

#include "common.h"
#include "log.h"
#include "llama-ext.h"
#include "speculative.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

// patch 0007's queries, weak references: null in a libcommon without them (baseline and the fixes before
// 0007), whose drafts all keep the target's positions
bool common_speculative_own_positions(const common_speculative * spec) __attribute__((weak));
bool common_speculative_own_positions_text(const common_speculative * spec) __attribute__((weak));

namespace {

thread_local std::string g_last_error;

int32_t fail(const std::string & msg) {
    g_last_error = msg;
    return PYLLAMA_DFLASH_ERROR;
}

// Runs body; a thrown exception becomes PYLLAMA_DFLASH_ERROR with its message.
template <typename F>
int32_t guarded(const char * where, F && body) {
    try {
        return body();
    } catch (const std::exception & e) {
        return fail(std::string(where) + ": C++ exception: " + e.what());
    } catch (...) {
        return fail(std::string(where) + ": unknown C++ exception");
    }
}

} // namespace

struct pyllama_dflash_spec {
    common_params_speculative params;
    common_speculative *      spec    = nullptr;
    llama_context *           ctx_tgt = nullptr;
    llama_context *           ctx_dft = nullptr;
    int32_t                   n_seq   = 0;

    std::vector<llama_tokens> prompts;     // per seq: what the driver's draft params point at
    std::vector<llama_tokens> results;     // per seq: the driver writes drafts here
    std::vector<bool>         has_drafted; // per seq: accept(n > 0) asserts without a prior draft

    ~pyllama_dflash_spec() { common_speculative_free(spec); }
};

extern "C" {

int32_t pyllama_dflash_shim_abi(void) { return PYLLAMA_DFLASH_SHIM_ABI; }

const char * pyllama_dflash_last_error(void) { return g_last_error.c_str(); }

void pyllama_dflash_clear_error(void) { g_last_error.clear(); }

// ---- src/llama-ext.h ------------------------------------------------------------------

int32_t pyllama_dflash_set_embeddings_layer_inp(llama_context * ctx, uint32_t lid, bool value) {
    return guarded(__func__, [&]() -> int32_t {
        if (!ctx) return fail("set_embeddings_layer_inp: ctx is NULL");
        const uint32_t n_layer = (uint32_t) llama_model_n_layer(llama_get_model(ctx));
        if (lid > n_layer) { // llama.cpp asserts lid <= n_layer
            return fail("set_embeddings_layer_inp: layer " + std::to_string(lid) + " > n_layer " + std::to_string(n_layer));
        }
        llama_set_embeddings_layer_inp(ctx, lid, value);
        return PYLLAMA_DFLASH_OK;
    });
}

const float * pyllama_dflash_get_embeddings_layer_inp(llama_context * ctx, uint32_t lid) {
    const float * out = nullptr;
    const int32_t rc = guarded(__func__, [&]() -> int32_t {
        if (!ctx) return fail("get_embeddings_layer_inp: ctx is NULL");
        const uint32_t n_layer = (uint32_t) llama_model_n_layer(llama_get_model(ctx));
        if (lid > n_layer) {
            return fail("get_embeddings_layer_inp: layer " + std::to_string(lid) + " > n_layer " + std::to_string(n_layer));
        }
        // note: llama.cpp still asserts when extraction was never enabled for lid or nothing was decoded
        out = llama_get_embeddings_layer_inp(ctx, lid);
        return PYLLAMA_DFLASH_OK;
    });
    return rc == PYLLAMA_DFLASH_OK ? out : nullptr;
}

const float * pyllama_dflash_get_embeddings_nextn(llama_context * ctx) {
    const float * out = nullptr;
    const int32_t rc = guarded(__func__, [&]() -> int32_t {
        if (!ctx) return fail("get_embeddings_nextn: ctx is NULL");
        out = llama_get_embeddings_nextn(ctx);
        if (!out) return fail("get_embeddings_nextn: no hidden states: their extraction is off (set_embeddings_nextn)");
        return PYLLAMA_DFLASH_OK;
    });
    return rc == PYLLAMA_DFLASH_OK ? out : nullptr;
}

int32_t pyllama_dflash_set_embeddings_nextn(llama_context * ctx, bool value, bool masked) {
    return guarded(__func__, [&]() -> int32_t {
        if (!ctx) return fail("set_embeddings_nextn: ctx is NULL");
        llama_set_embeddings_nextn(ctx, value, masked);
        return PYLLAMA_DFLASH_OK;
    });
}

uint32_t pyllama_dflash_model_target_layer_ids_n(const llama_model * model) {
    return model ? llama_model_target_layer_ids_n(model) : 0;
}

const int32_t * pyllama_dflash_model_target_layer_ids(const llama_model * model) {
    return model ? llama_model_target_layer_ids(model) : nullptr;
}

llama_context * pyllama_dflash_get_ctx_other(llama_context * ctx) {
    return ctx ? llama_get_ctx_other(ctx) : nullptr;
}

// ---- llama_batch_ext from flat arrays -------------------------------------------------

int32_t pyllama_dflash_batch_ext_fill(
        llama_batch_ext * batch, int32_t n_tokens, const llama_token * tokens, const float * embd,
        int32_t n_embd, const llama_pos * pos, int32_t n_pos, const llama_seq_id * seq_ids, const int8_t * output,
        const float * state, int32_t n_state) {
    return guarded(__func__, [&]() -> int32_t {
        if (!batch) return fail("batch_ext_fill: batch is NULL");
        if (n_tokens < 0) return fail("batch_ext_fill: n_tokens < 0");
        if (!pos) return fail("batch_ext_fill: pos is NULL");
        if (n_pos < 1 || n_pos > GGML_MROPE_SECTIONS) return fail("batch_ext_fill: n_pos must be 1..4");
        if (!tokens && (!embd || n_embd <= 0)) return fail("batch_ext_fill: need tokens or embd with n_embd > 0");
        if (state && n_state <= 0) return fail("batch_ext_fill: state rows need n_state > 0");

        llama_batch_ext_clear(batch);
        for (int32_t i = 0; i < n_tokens; ++i) {
            const llama_seq_id seq = seq_ids ? seq_ids[i] : 0;
            const int32_t idx = tokens
                ? llama_batch_ext_add_token(batch, seq, tokens[i])
                : llama_batch_ext_add_embd(batch, seq, { embd + (size_t) i * n_embd, 1, (size_t) n_embd });
            if (idx < 0) {
                g_last_error = "batch_ext_fill: row " + std::to_string(i) + " rejected with " + std::to_string(idx) +
                               " (-1 full, -2 bad token/embedding, -3 bad seq id)";
                return idx;
            }
            std::array<llama_pos, GGML_MROPE_SECTIONS> p = { 0, 0, 0, 0 };
            for (int32_t j = 0; j < n_pos; ++j) {
                p[j] = pos[(size_t) j * n_tokens + i];
            }
            llama_batch_ext_set_pos(batch, idx, p.data());
            if (state && !llama_batch_ext_set_embd_state(batch, idx, { state + (size_t) i * n_state, 1, (size_t) n_state })) {
                // b11434 declares llama_batch_ext_set_embd_state but refuses every state (a stub); 0009 implements it
                return fail("batch_ext_fill: row " + std::to_string(i) + ": llama_batch_ext_set_embd_state refused its " +
                            std::to_string(n_state) + "-float state (this build refuses every state, or the width is not "
                            "the model's output width)");
            }
            if (output && output[i]) {
                llama_batch_ext_set_output_logits(batch, idx, true);
            }
        }
        return PYLLAMA_DFLASH_OK;
    });
}

// ---- speculative driver ---------------------------------------------------------------

pyllama_dflash_spec_params pyllama_dflash_spec_default_params(void) {
    const common_params_speculative_draft defaults;
    pyllama_dflash_spec_params p;
    p.n_seq            = 1;
    p.n_max            = defaults.n_max;
    p.n_min            = defaults.n_min;
    p.p_min            = defaults.p_min;
    p.backend_sampling = defaults.backend_sampling;
    p.type             = COMMON_SPECULATIVE_TYPE_DRAFT_DFLASH;
    return p;
}

int32_t pyllama_dflash_spec_type_from_name(const char * name) {
    return guarded(__func__, [&]() -> int32_t {
        if (!name) return fail("spec_type_from_name: name is NULL");
        const common_speculative_type type = common_speculative_type_from_name(name);
        if (type == COMMON_SPECULATIVE_TYPE_COUNT) {
            return fail(std::string("spec_type_from_name: unknown speculative type '") + name + "'");
        }
        return (int32_t) type;
    });
}

int32_t pyllama_dflash_spec_type_from_gguf(const char * path) {
    return guarded(__func__, [&]() -> int32_t {
        if (!path) return fail("spec_type_from_gguf: path is NULL");
        const std::vector<common_speculative_type> types = common_speculative_types_from_gguf(path);
        if (types.empty()) {
            return fail(std::string("spec_type_from_gguf: ") + path + ": no speculative type detected");
        }
        return (int32_t) types.front();
    });
}

pyllama_dflash_spec * pyllama_dflash_spec_init(
        llama_context * ctx_tgt, llama_context * ctx_dft, const pyllama_dflash_spec_params * params) {
    pyllama_dflash_spec * out = nullptr;
    guarded(__func__, [&]() -> int32_t {
        if (!ctx_tgt || !ctx_dft) return fail("spec_init: DFlash needs both a target and a draft context");
        if (ctx_tgt == ctx_dft)   return fail("spec_init: target and draft are the same context");
        const pyllama_dflash_spec_params p = params ? *params : pyllama_dflash_spec_default_params();
        if (p.n_seq < 1) return fail("spec_init: n_seq must be >= 1");
        if (p.n_max < 1) return fail("spec_init: n_max must be >= 1");
        const bool block = p.type == COMMON_SPECULATIVE_TYPE_DRAFT_DFLASH || p.type == COMMON_SPECULATIVE_TYPE_DRAFT_DSPARK;
        const bool eagle3 = p.type == COMMON_SPECULATIVE_TYPE_DRAFT_EAGLE3;
        const bool mtp    = p.type == COMMON_SPECULATIVE_TYPE_DRAFT_MTP;
        if (!block && !eagle3 && !mtp) {
            return fail("spec_init: type " + std::to_string(p.type) + " (" +
                        common_speculative_type_to_str((common_speculative_type) p.type) +
                        ") is not a drafter this shim drives (draft-dflash, draft-dspark, draft-eagle3, draft-mtp)");
        }

        // what the DFlash constructor would otherwise assert on, or silently get wrong
        // llama.cpp keeps ctx_other only for drafts that borrow the target's embeddings/output
        const llama_context * other = llama_get_ctx_other(ctx_dft);
        if (other != nullptr && other != ctx_tgt) {
            return fail("spec_init: the draft context was created over another target (ctx_other differs)");
        }
        const llama_model * model_tgt = llama_get_model(ctx_tgt);
        const llama_model * model_dft = llama_get_model(ctx_dft);
        const uint32_t n_ids = llama_model_target_layer_ids_n(model_dft);
        if (!mtp && n_ids == 0) {
            return fail("spec_init: the draft model has no target_layer_ids (not a DFlash or EAGLE3 draft?)");
        }
        if (eagle3 && n_ids != 3) {
            return fail("spec_init: an EAGLE3 draft reads 3 target layers, this one " + std::to_string(n_ids));
        }
        const int32_t * ids = llama_model_target_layer_ids(model_dft);
        // EAGLE3 may read one past the last layer: the target's final hidden state
        const int32_t n_layer_tgt = llama_model_n_layer(model_tgt) + (eagle3 ? 1 : 0);
        for (uint32_t k = 0; !mtp && k < n_ids; ++k) {
            if (ids[k] < 0 || ids[k] >= n_layer_tgt) {
                return fail("spec_init: draft target_layer_ids[" + std::to_string(k) + "] = " + std::to_string(ids[k]) +
                            " is outside the target's " + std::to_string(n_layer_tgt) + " layers");
            }
        }
        // draft-mtp drafts with the target's own MTP head, or with an assistant model that reads the
        // target's memory (Gemma 4's: llama.cpp keeps ctx_other for it)
        if (mtp && model_dft != model_tgt && other != ctx_tgt) {
            return fail("spec_init: draft-mtp drafts with the target's own MTP head or an assistant over the "
                        "target's memory: the draft context must be an MTP context over the target's model, "
                        "or over an assistant model with the target as ctx_other");
        }
        if ((uint32_t) p.n_seq > llama_n_seq_max(ctx_tgt) || (uint32_t) p.n_seq > llama_n_seq_max(ctx_dft)) {
            return fail("spec_init: n_seq " + std::to_string(p.n_seq) + " exceeds n_seq_max of target (" +
                        std::to_string(llama_n_seq_max(ctx_tgt)) + ") or draft (" + std::to_string(llama_n_seq_max(ctx_dft)) + ")");
        }

        auto * s = new pyllama_dflash_spec();
        s->ctx_tgt = ctx_tgt;
        s->ctx_dft = ctx_dft;
        s->n_seq   = p.n_seq;
        s->params.types                  = { (common_speculative_type) p.type };
        s->params.draft.ctx_tgt          = ctx_tgt;
        s->params.draft.ctx_dft          = ctx_dft;
        s->params.draft.n_max            = p.n_max;
        s->params.draft.n_min            = p.n_min;
        s->params.draft.p_min            = p.p_min;
        s->params.draft.backend_sampling = p.backend_sampling;
        s->prompts.assign(p.n_seq, {});
        s->results.assign(p.n_seq, {});
        s->has_drafted.assign(p.n_seq, false);
        try {
            s->spec = common_speculative_init(s->params, (uint32_t) p.n_seq);
        } catch (...) {
            delete s;
            throw;
        }
        if (!s->spec) {
            delete s;
            return fail("spec_init: common_speculative_init returned NULL (no implementation enabled)");
        }
        out = s;
        return PYLLAMA_DFLASH_OK;
    });
    return out;
}

void pyllama_dflash_spec_free(pyllama_dflash_spec * spec) {
    guarded(__func__, [&]() -> int32_t {
        delete spec;
        return PYLLAMA_DFLASH_OK;
    });
}

int32_t pyllama_dflash_spec_n_max(const pyllama_dflash_spec * spec) {
    return guarded(__func__, [&]() -> int32_t {
        if (!spec) return fail("spec_n_max: spec is NULL");
        return common_speculative_n_max(spec->spec);
    });
}

int32_t pyllama_dflash_spec_own_positions(const pyllama_dflash_spec * spec) {
    return guarded(__func__, [&]() -> int32_t {
        if (!spec) return fail("spec_own_positions: spec is NULL");
        if (common_speculative_own_positions == nullptr) return PYLLAMA_DFLASH_FALSE;
        return common_speculative_own_positions(spec->spec) ? PYLLAMA_DFLASH_TRUE : PYLLAMA_DFLASH_FALSE;
    });
}

int32_t pyllama_dflash_spec_own_positions_text(const pyllama_dflash_spec * spec) {
    return guarded(__func__, [&]() -> int32_t {
        if (!spec) return fail("spec_own_positions_text: spec is NULL");
        if (common_speculative_own_positions_text == nullptr) return PYLLAMA_DFLASH_FALSE;
        return common_speculative_own_positions_text(spec->spec) ? PYLLAMA_DFLASH_TRUE : PYLLAMA_DFLASH_FALSE;
    });
}

namespace {

// DFlash process() reads the target's extracted layer inputs for these rows; llama.cpp asserts
// when nothing was decoded, so refuse rows the target's memory does not hold yet.
int32_t check_target_decoded(const pyllama_dflash_spec * spec, const common_batch & batch) {
    std::vector<llama_pos> max_pos(spec->n_seq, -1);
    for (const auto & t : batch.tokens) {
        if (t.seq_id < 0 || t.seq_id >= spec->n_seq) {
            return fail("process: seq_id " + std::to_string(t.seq_id) + " outside [0, " + std::to_string(spec->n_seq) + ")");
        }
        max_pos[t.seq_id] = std::max(max_pos[t.seq_id], t.pos[0]);
    }
    llama_memory_t mem = llama_get_memory(spec->ctx_tgt);
    for (int32_t s = 0; s < spec->n_seq; ++s) {
        if (max_pos[s] < 0) continue;
        const llama_pos have = llama_memory_seq_pos_max(mem, s);
        if (have < max_pos[s]) {
            return fail("process: the target holds seq " + std::to_string(s) + " up to pos " + std::to_string(have) +
                        " but the batch reaches pos " + std::to_string(max_pos[s]) +
                        "; process() takes the batch the target just decoded");
        }
    }
    return PYLLAMA_DFLASH_OK;
}

int32_t run_process(pyllama_dflash_spec * spec, const common_batch & batch) {
    if (check_target_decoded(spec, batch) != PYLLAMA_DFLASH_OK) {
        return PYLLAMA_DFLASH_ERROR;
    }
    return common_speculative_process(spec->spec, batch) ? PYLLAMA_DFLASH_TRUE : PYLLAMA_DFLASH_FALSE;
}

// the loop of llama-server's post-decode callback in process_mtmd_chunk()
void add_embd_rows(common_batch & batch, int32_t n_tokens, const float * embd, int32_t n_embd,
                   const llama_pos * pos, int32_t n_pos, const llama_seq_id * seq_ids, llama_seq_id seq_all) {
    for (int32_t i = 0; i < n_tokens; ++i) {
        llama_pos p[GGML_MROPE_SECTIONS] = { 0, 0, 0, 0 };
        for (int32_t j = 0; j < n_pos; ++j) {
            p[j] = pos[(size_t) j * n_tokens + i];
        }
        batch.add_embd({ embd + (size_t) i * n_embd, 1, (size_t) n_embd }, p, seq_ids ? seq_ids[i] : seq_all, false);
    }
}

int32_t check_embd_args(int32_t n_tokens, const float * embd, int32_t n_embd, const llama_pos * pos, int32_t n_pos) {
    if (n_tokens < 0)                             return fail("process: n_tokens < 0");
    if (n_tokens > 0 && (!embd || !pos))          return fail("process: embd and pos must not be NULL");
    if (n_embd <= 0)                              return fail("process: n_embd must be > 0");
    if (n_pos < 1 || n_pos > GGML_MROPE_SECTIONS) return fail("process: n_pos must be 1..4");
    return PYLLAMA_DFLASH_OK;
}

} // namespace

int32_t pyllama_dflash_spec_process_embd_view(pyllama_dflash_spec * spec, const mtmd_helper_embd_batch * view) {
    return guarded(__func__, [&]() -> int32_t {
        if (!spec) return fail("process: spec is NULL");
        if (!view) return fail("process: view is NULL");
        if (check_embd_args(view->n_tokens, view->embd, view->n_embd, view->pos, view->n_pos) != PYLLAMA_DFLASH_OK) {
            return PYLLAMA_DFLASH_ERROR;
        }
        common_batch batch(spec->ctx_tgt);
        add_embd_rows(batch, view->n_tokens, view->embd, view->n_embd, view->pos, view->n_pos, nullptr, view->seq_id);
        return run_process(spec, batch);
    });
}

int32_t pyllama_dflash_spec_process_tokens(
        pyllama_dflash_spec * spec, int32_t n_tokens, const llama_token * tokens,
        const llama_pos * pos, const llama_seq_id * seq_ids, const int8_t * output) {
    return guarded(__func__, [&]() -> int32_t {
        if (!spec) return fail("process: spec is NULL");
        if (n_tokens < 0) return fail("process: n_tokens < 0");
        if (n_tokens > 0 && (!tokens || !pos)) return fail("process: tokens and pos must not be NULL");
        // llama-server hands over batch.view: one entry per decoded token, pos[0] only
        common_batch batch(spec->ctx_tgt);
        for (int32_t i = 0; i < n_tokens; ++i) {
            batch.add(tokens[i], pos[i], seq_ids ? seq_ids[i] : 0, output ? output[i] != 0 : false);
        }
        return run_process(spec, batch);
    });
}

int32_t pyllama_dflash_spec_process_embd(
        pyllama_dflash_spec * spec, int32_t n_tokens, const float * embd, int32_t n_embd,
        const llama_pos * pos, int32_t n_pos, const llama_seq_id * seq_ids) {
    return guarded(__func__, [&]() -> int32_t {
        if (!spec) return fail("process: spec is NULL");
        if (check_embd_args(n_tokens, embd, n_embd, pos, n_pos) != PYLLAMA_DFLASH_OK) {
            return PYLLAMA_DFLASH_ERROR;
        }
        common_batch batch(spec->ctx_tgt);
        add_embd_rows(batch, n_tokens, embd, n_embd, pos, n_pos, seq_ids, 0);
        return run_process(spec, batch);
    });
}

int32_t pyllama_dflash_spec_begin(pyllama_dflash_spec * spec, llama_seq_id seq_id, const llama_token * prompt, int32_t n_prompt) {
    return guarded(__func__, [&]() -> int32_t {
        if (!spec) return fail("begin: spec is NULL");
        if (seq_id < 0 || seq_id >= spec->n_seq) return fail("begin: seq_id " + std::to_string(seq_id) + " out of range");
        if (n_prompt < 0 || (n_prompt > 0 && !prompt)) return fail("begin: bad prompt");
        spec->prompts[seq_id].assign(prompt, prompt + n_prompt);
        common_speculative_begin(spec->spec, seq_id, spec->prompts[seq_id]);
        return PYLLAMA_DFLASH_OK;
    });
}

int32_t pyllama_dflash_spec_draft(
        pyllama_dflash_spec * spec, llama_seq_id seq_id, llama_token id_last, llama_pos pos0,
        int32_t n_max, llama_token * out, int32_t out_cap) {
    return guarded(__func__, [&]() -> int32_t {
        if (!spec) return fail("draft: spec is NULL");
        if (seq_id < 0 || seq_id >= spec->n_seq) return fail("draft: seq_id " + std::to_string(seq_id) + " out of range");
        if (out_cap < 0 || (out_cap > 0 && !out)) return fail("draft: bad output buffer");

        // only this sequence drafts; the driver asserts that a drafting sequence's result is empty
        for (int32_t s = 0; s < spec->n_seq; ++s) {
            common_speculative_get_draft_params(spec->spec, s).drafting = false;
        }
        auto & result = spec->results[seq_id];
        result.clear();

        common_speculative_draft_params & dp = common_speculative_get_draft_params(spec->spec, seq_id);
        dp = {};
        dp.drafting = true;
        dp.n_max    = n_max > 0 ? n_max : -1;
        dp.pos0     = pos0;
        dp.id_last  = id_last;
        dp.prompt   = &spec->prompts[seq_id];
        dp.result   = &result;

        common_speculative_draft(spec->spec);

        if (!result.empty()) {
            spec->has_drafted[seq_id] = true;
        }
        const int32_t n = (int32_t) result.size();
        std::memcpy(out, result.data(), sizeof(llama_token) * (size_t) std::min(n, out_cap));
        return n;
    });
}

int32_t pyllama_dflash_spec_accept(pyllama_dflash_spec * spec, llama_seq_id seq_id, uint16_t n_accepted) {
    return guarded(__func__, [&]() -> int32_t {
        if (!spec) return fail("accept: spec is NULL");
        if (seq_id < 0 || seq_id >= spec->n_seq) return fail("accept: seq_id " + std::to_string(seq_id) + " out of range");
        if (n_accepted > 0 && !spec->has_drafted[seq_id]) {
            // libcommon asserts here: nothing was drafted for this sequence yet
            return fail("accept: n_accepted > 0 but no draft was made for seq " + std::to_string(seq_id));
        }
        common_speculative_accept(spec->spec, seq_id, n_accepted);
        return PYLLAMA_DFLASH_OK;
    });
}

int32_t pyllama_dflash_spec_get_state(pyllama_dflash_spec * spec, llama_seq_id seq_id, uint8_t * out, int32_t out_cap) {
    return guarded(__func__, [&]() -> int32_t {
        if (!spec) return fail("get_state: spec is NULL");
        if (seq_id < 0 || seq_id >= spec->n_seq) return fail("get_state: seq_id " + std::to_string(seq_id) + " out of range");
        if (out_cap < 0 || (out_cap > 0 && out == nullptr)) return fail("get_state: out_cap > 0 needs out");
        std::vector<uint8_t> data;
        if (!common_speculative_get_state(spec->spec, seq_id, data)) return 0;
        if (data.size() > (size_t) INT32_MAX) return fail("get_state: the state is larger than an int32_t counts");
        if (!data.empty() && (size_t) out_cap >= data.size()) std::memcpy(out, data.data(), data.size());
        return (int32_t) data.size();
    });
}

int32_t pyllama_dflash_spec_set_state(pyllama_dflash_spec * spec, llama_seq_id seq_id, const uint8_t * data, int32_t n_data) {
    return guarded(__func__, [&]() -> int32_t {
        if (!spec) return fail("set_state: spec is NULL");
        if (seq_id < 0 || seq_id >= spec->n_seq) return fail("set_state: seq_id " + std::to_string(seq_id) + " out of range");
        if (n_data < 0 || (n_data > 0 && data == nullptr)) return fail("set_state: n_data > 0 needs data");
        common_speculative_set_state(spec->spec, seq_id, std::vector<uint8_t>(data, data + n_data));
        return PYLLAMA_DFLASH_OK;
    });
}

// ---- libcommon's logger ------------------------------------------------------------------

int32_t pyllama_dflash_common_log_to_file(const char * path) {
    return guarded(__func__, [&]() -> int32_t {
        // the "E "/"W "/"I " prefix is the only way a reader of the file can tell levels apart
        common_log_set_prefix(common_log_main(), path != nullptr);
        common_log_set_file(common_log_main(), path);
        return PYLLAMA_DFLASH_OK;
    });
}

void pyllama_dflash_common_log_flush(void) {
    guarded(__func__, [&]() -> int32_t {
        common_log_flush(common_log_main());
        return PYLLAMA_DFLASH_OK;
    });
}

void pyllama_dflash_common_log_set_verbosity(int32_t verbosity) {
    common_log_set_verbosity_thold(verbosity);
}

} // extern "C"
