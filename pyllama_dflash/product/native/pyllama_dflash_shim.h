/* pyllama_dflash_shim: a plain C face for what llama.cpp b11434 only offers in C++.
 *
 *  - the src/llama-ext.h calls (exported with C++ names only),
 *  - libcommon's speculative driver (common_speculative_*, common_batch), used here with
 *    the draft-dflash type over a target and a draft context, fed the same way
 *    llama-server feeds it,
 *  - a C loop that fills a llama_batch_ext from flat arrays (llama_process's input),
 *  - a tap on libcommon's own logger, which has no callback, only a file.
 *
 * Error contract: no C++ exception crosses this boundary. Every call that can fail returns
 * a status (PYLLAMA_DFLASH_ERROR or NULL) and leaves a message for
 * pyllama_dflash_last_error() on the calling thread. Arguments that would make llama.cpp
 * abort (GGML_ASSERT) are checked here first, where that is possible.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llama.h"
#include "mtmd-helper.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PYLLAMA_DFLASH_SHIM_API __attribute__((visibility("default")))

/* bumped whenever a signature below changes; the Python side checks it at load time */
#define PYLLAMA_DFLASH_SHIM_ABI 4

/* return codes of the shim's own calls */
#define PYLLAMA_DFLASH_ERROR  (-1) /* bad arguments or a caught C++ exception: see last_error */
#define PYLLAMA_DFLASH_FALSE    0  /* the wrapped call ran and answered false */
#define PYLLAMA_DFLASH_TRUE     1  /* the wrapped call ran and answered true */
#define PYLLAMA_DFLASH_OK       0

PYLLAMA_DFLASH_SHIM_API int32_t      pyllama_dflash_shim_abi(void);
PYLLAMA_DFLASH_SHIM_API const char * pyllama_dflash_last_error(void); /* "" when none; per thread */
PYLLAMA_DFLASH_SHIM_API void         pyllama_dflash_clear_error(void);

/* ---- src/llama-ext.h ---------------------------------------------------------------- */

PYLLAMA_DFLASH_SHIM_API int32_t pyllama_dflash_set_embeddings_layer_inp(struct llama_context * ctx, uint32_t lid, bool value);
/* NULL (with last_error) when the layer is out of range; llama.cpp itself asserts */
PYLLAMA_DFLASH_SHIM_API const float * pyllama_dflash_get_embeddings_layer_inp(struct llama_context * ctx, uint32_t lid);
PYLLAMA_DFLASH_SHIM_API int32_t pyllama_dflash_set_embeddings_nextn(struct llama_context * ctx, bool value, bool masked);
/* the hidden states of the last decode's rows (unmasked: one per row); NULL (with last_error) when off */
PYLLAMA_DFLASH_SHIM_API const float * pyllama_dflash_get_embeddings_nextn(struct llama_context * ctx);
PYLLAMA_DFLASH_SHIM_API uint32_t        pyllama_dflash_model_target_layer_ids_n(const struct llama_model * model);
PYLLAMA_DFLASH_SHIM_API const int32_t * pyllama_dflash_model_target_layer_ids(const struct llama_model * model);
PYLLAMA_DFLASH_SHIM_API struct llama_context * pyllama_dflash_get_ctx_other(struct llama_context * ctx);

/* ---- llama_batch_ext from flat arrays --------------------------------------------- */

/* Clears `batch`, then adds n_tokens rows: token rows when tokens != NULL, else embedding rows
 * (embd is [n_tokens, n_embd]). pos is [n_pos, n_tokens], section-major (n_pos 1..4; token rows
 * read row 0 only). seq_ids and output may be NULL (seq 0; no outputs). state, when not NULL, is
 * [n_tokens, n_state]: each row's hidden state, set with llama_batch_ext_set_embd_state (MTP's second
 * input; b11434 refuses every state, patch 0009 takes them).
 * Returns PYLLAMA_DFLASH_OK, or the negative code llama_batch_ext_add_* gave (-1 full, -2 bad
 * token/embedding, -3 bad seq id), or PYLLAMA_DFLASH_ERROR for bad arguments and a refused state. */
PYLLAMA_DFLASH_SHIM_API int32_t pyllama_dflash_batch_ext_fill(
        struct llama_batch_ext * batch,
        int32_t                  n_tokens,
        const llama_token      * tokens,
        const float            * embd,
        int32_t                  n_embd,
        const llama_pos        * pos,
        int32_t                  n_pos,
        const llama_seq_id     * seq_ids,
        const int8_t           * output,
        const float            * state,
        int32_t                  n_state);

/* ---- libcommon's speculative driver (draft-dflash, -dspark, -eagle3, -mtp) -------- */

typedef struct pyllama_dflash_spec pyllama_dflash_spec;

struct pyllama_dflash_spec_params {
    int32_t n_seq;            /* sequences the driver tracks (llama-server: n_parallel) */
    int32_t n_max;            /* max drafted tokens (clamped by the draft's block size) */
    int32_t n_min;
    float   p_min;
    bool    backend_sampling; /* llama-server's default: true */
    int32_t type;             /* a common_speculative_type (see spec_type_from_name); default draft-dflash */
};

PYLLAMA_DFLASH_SHIM_API struct pyllama_dflash_spec_params pyllama_dflash_spec_default_params(void);

/* the common_speculative_type of a --spec-type name ("draft-dflash", "draft-dspark", ...), or
 * PYLLAMA_DFLASH_ERROR for a name libcommon does not know */
PYLLAMA_DFLASH_SHIM_API int32_t pyllama_dflash_spec_type_from_name(const char * name);
/* the type llama-server detects from a draft file when no --spec-type is given (a Markov head
 * makes draft-dspark, another dflash draft draft-dflash); PYLLAMA_DFLASH_ERROR when it detects none */
PYLLAMA_DFLASH_SHIM_API int32_t pyllama_dflash_spec_type_from_gguf(const char * path);

/* Create before the target decodes anything: the DFlash constructor turns on layer-input
 * extraction on ctx_tgt and non-causal attention on ctx_dft. ctx_dft must have been created
 * with ctx_other == ctx_tgt. NULL on failure. */
PYLLAMA_DFLASH_SHIM_API pyllama_dflash_spec * pyllama_dflash_spec_init(
        struct llama_context * ctx_tgt,
        struct llama_context * ctx_dft,
        const struct pyllama_dflash_spec_params * params);
PYLLAMA_DFLASH_SHIM_API void    pyllama_dflash_spec_free(pyllama_dflash_spec * spec);
PYLLAMA_DFLASH_SHIM_API int32_t pyllama_dflash_spec_n_max(const pyllama_dflash_spec * spec);
/* TRUE where the draft keeps positions of its own, one per row of a sequence (patch 0007's
 * common_speculative_own_positions); FALSE where it keeps the target's, as every libcommon without
 * that query does. */
PYLLAMA_DFLASH_SHIM_API int32_t pyllama_dflash_spec_own_positions(const pyllama_dflash_spec * spec);
/* TRUE where those positions count the text rows only, an image's rows left out of the draft's context
 * (0007's common_speculative_own_positions_text: EAGLE3); FALSE otherwise, and in every libcommon
 * without that query. */
PYLLAMA_DFLASH_SHIM_API int32_t pyllama_dflash_spec_own_positions_text(const pyllama_dflash_spec * spec);

/* The process() family hands common_speculative_process() the batch the target just decoded,
 * built as a common_batch exactly like llama-server does. TRUE/FALSE is what libcommon
 * answered (FALSE is what makes llama-server throw "failed to process speculative batch"). */

/* the view mtmd_helper_decode_image_chunk passes its post-decode callback */
PYLLAMA_DFLASH_SHIM_API int32_t pyllama_dflash_spec_process_embd_view(
        pyllama_dflash_spec * spec, const struct mtmd_helper_embd_batch * view);

/* token rows, one position each; seq_ids/output may be NULL */
PYLLAMA_DFLASH_SHIM_API int32_t pyllama_dflash_spec_process_tokens(
        pyllama_dflash_spec * spec, int32_t n_tokens, const llama_token * tokens,
        const llama_pos * pos, const llama_seq_id * seq_ids, const int8_t * output);

/* embedding rows [n_tokens, n_embd] with pos [n_pos, n_tokens] section-major; seq_ids may be NULL */
PYLLAMA_DFLASH_SHIM_API int32_t pyllama_dflash_spec_process_embd(
        pyllama_dflash_spec * spec, int32_t n_tokens, const float * embd, int32_t n_embd,
        const llama_pos * pos, int32_t n_pos, const llama_seq_id * seq_ids);

/* the prompt is kept per sequence and handed to the driver's draft params */
PYLLAMA_DFLASH_SHIM_API int32_t pyllama_dflash_spec_begin(
        pyllama_dflash_spec * spec, llama_seq_id seq_id, const llama_token * prompt, int32_t n_prompt);

/* drafts for one sequence from id_last at pos0; writes up to out_cap tokens to out and returns
 * how many were drafted (>= 0), or PYLLAMA_DFLASH_ERROR. n_max <= 0: the driver's own limit. */
PYLLAMA_DFLASH_SHIM_API int32_t pyllama_dflash_spec_draft(
        pyllama_dflash_spec * spec, llama_seq_id seq_id, llama_token id_last, llama_pos pos0,
        int32_t n_max, llama_token * out, int32_t out_cap);

PYLLAMA_DFLASH_SHIM_API int32_t pyllama_dflash_spec_accept(
        pyllama_dflash_spec * spec, llama_seq_id seq_id, uint16_t n_accepted);

/* what the driver keeps of a sequence besides the draft's memory (common_speculative_get_state:
 * EAGLE3's pending row, which llama-server keeps with a context checkpoint): its size in bytes, 0 for
 * none, written to out when out_cap holds it; or PYLLAMA_DFLASH_ERROR */
PYLLAMA_DFLASH_SHIM_API int32_t pyllama_dflash_spec_get_state(
        pyllama_dflash_spec * spec, llama_seq_id seq_id, uint8_t * out, int32_t out_cap);

/* common_speculative_set_state; n_data 0 forgets it (llama-server after a slot restore or a prompt
 * cache load: the sequence's rows come from elsewhere) */
PYLLAMA_DFLASH_SHIM_API int32_t pyllama_dflash_spec_set_state(
        pyllama_dflash_spec * spec, llama_seq_id seq_id, const uint8_t * data, int32_t n_data);

/* ---- libcommon's logger (LOG_INF/LOG_ERR inside common/ sources) ----------------------- */

/* mirror libcommon's log lines into a file (NULL stops), with a level prefix ("E ", "W ", "I ",
 * "D "); libcommon keeps printing to stderr too, with the same prefix while the file is set */
PYLLAMA_DFLASH_SHIM_API int32_t pyllama_dflash_common_log_to_file(const char * path);
/* wait until queued lines are written, so the file can be read */
PYLLAMA_DFLASH_SHIM_API void    pyllama_dflash_common_log_flush(void);
PYLLAMA_DFLASH_SHIM_API void    pyllama_dflash_common_log_set_verbosity(int32_t verbosity);

#ifdef __cplusplus
}
#endif
