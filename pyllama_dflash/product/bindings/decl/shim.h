/* pyllama_dflash_shim.h: the shim's C API (see pyllama_dflash/native/pyllama_dflash_shim.h). */

#define PYLLAMA_DFLASH_SHIM_ABI ...
#define PYLLAMA_DFLASH_ERROR ...
#define PYLLAMA_DFLASH_FALSE ...
#define PYLLAMA_DFLASH_TRUE ...
#define PYLLAMA_DFLASH_OK ...

int32_t      pyllama_dflash_shim_abi(void);
const char * pyllama_dflash_last_error(void);
void         pyllama_dflash_clear_error(void);

/* src/llama-ext.h */
int32_t         pyllama_dflash_set_embeddings_layer_inp(struct llama_context * ctx, uint32_t lid, bool value);
const float *   pyllama_dflash_get_embeddings_layer_inp(struct llama_context * ctx, uint32_t lid);
int32_t         pyllama_dflash_set_embeddings_nextn(struct llama_context * ctx, bool value, bool masked);
const float *   pyllama_dflash_get_embeddings_nextn(struct llama_context * ctx);
uint32_t        pyllama_dflash_model_target_layer_ids_n(const struct llama_model * model);
const int32_t * pyllama_dflash_model_target_layer_ids(const struct llama_model * model);
struct llama_context * pyllama_dflash_get_ctx_other(struct llama_context * ctx);

/* llama_batch_ext from flat arrays */
int32_t pyllama_dflash_batch_ext_fill(struct llama_batch_ext * batch, int32_t n_tokens, const llama_token * tokens,
                                      const float * embd, int32_t n_embd, const llama_pos * pos, int32_t n_pos,
                                      const llama_seq_id * seq_ids, const int8_t * output, const float * state,
                                      int32_t n_state);

/* libcommon's speculative driver (draft-dflash, draft-dspark) */
typedef struct pyllama_dflash_spec pyllama_dflash_spec;

struct pyllama_dflash_spec_params {
    int32_t n_seq;
    int32_t n_max;
    int32_t n_min;
    float   p_min;
    bool    backend_sampling;
    int32_t type;
};

struct pyllama_dflash_spec_params pyllama_dflash_spec_default_params(void);
int32_t pyllama_dflash_spec_type_from_name(const char * name);
int32_t pyllama_dflash_spec_type_from_gguf(const char * path);
pyllama_dflash_spec * pyllama_dflash_spec_init(struct llama_context * ctx_tgt, struct llama_context * ctx_dft,
                                               const struct pyllama_dflash_spec_params * params);
void    pyllama_dflash_spec_free(pyllama_dflash_spec * spec);
int32_t pyllama_dflash_spec_n_max(const pyllama_dflash_spec * spec);
int32_t pyllama_dflash_spec_own_positions(const pyllama_dflash_spec * spec);
int32_t pyllama_dflash_spec_own_positions_text(const pyllama_dflash_spec * spec);
int32_t pyllama_dflash_spec_process_embd_view(pyllama_dflash_spec * spec, const struct mtmd_helper_embd_batch * view);
int32_t pyllama_dflash_spec_process_tokens(pyllama_dflash_spec * spec, int32_t n_tokens, const llama_token * tokens,
                                           const llama_pos * pos, const llama_seq_id * seq_ids, const int8_t * output);
int32_t pyllama_dflash_spec_process_embd(pyllama_dflash_spec * spec, int32_t n_tokens, const float * embd, int32_t n_embd,
                                         const llama_pos * pos, int32_t n_pos, const llama_seq_id * seq_ids);
int32_t pyllama_dflash_spec_begin(pyllama_dflash_spec * spec, llama_seq_id seq_id, const llama_token * prompt, int32_t n_prompt);
int32_t pyllama_dflash_spec_draft(pyllama_dflash_spec * spec, llama_seq_id seq_id, llama_token id_last, llama_pos pos0,
                                  int32_t n_max, llama_token * out, int32_t out_cap);
int32_t pyllama_dflash_spec_accept(pyllama_dflash_spec * spec, llama_seq_id seq_id, uint16_t n_accepted);
int32_t pyllama_dflash_spec_get_state(pyllama_dflash_spec * spec, llama_seq_id seq_id, uint8_t * out, int32_t out_cap);
int32_t pyllama_dflash_spec_set_state(pyllama_dflash_spec * spec, llama_seq_id seq_id, const uint8_t * data, int32_t n_data);

/* libcommon's logger */
int32_t pyllama_dflash_common_log_to_file(const char * path);
void    pyllama_dflash_common_log_flush(void);
void    pyllama_dflash_common_log_set_verbosity(int32_t verbosity);
