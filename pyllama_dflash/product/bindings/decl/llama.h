/* llama.h (b11434), curated: models, contexts, both batch APIs, memory, vocab, logits, logs.
 * Structs end in `...;` so the C compiler, not this file, decides their layout. */

#define LLAMA_TOKEN_NULL ...
#define LLAMA_DEFAULT_SEED ...

struct llama_vocab;
struct llama_model;
struct llama_context;
struct llama_batch_ext;

typedef struct llama_memory_i * llama_memory_t;

typedef int32_t llama_pos;
typedef int32_t llama_token;
typedef int32_t llama_seq_id;

enum llama_rope_type {
    LLAMA_ROPE_TYPE_NONE,
    LLAMA_ROPE_TYPE_NORM,
    LLAMA_ROPE_TYPE_NEOX,
    LLAMA_ROPE_TYPE_MROPE,
    LLAMA_ROPE_TYPE_IMROPE,
    LLAMA_ROPE_TYPE_VISION,
    ...
};

enum llama_context_type {
    LLAMA_CONTEXT_TYPE_DEFAULT,
    LLAMA_CONTEXT_TYPE_MTP,
    ...
};

enum llama_flash_attn_type {
    LLAMA_FLASH_ATTN_TYPE_AUTO,
    LLAMA_FLASH_ATTN_TYPE_DISABLED,
    LLAMA_FLASH_ATTN_TYPE_ENABLED,
    ...
};

enum llama_process_type {
    LLAMA_PROCESS_TYPE_ENCODE,
    LLAMA_PROCESS_TYPE_DECODE,
    ...
};

typedef struct llama_batch {
    int32_t n_tokens;
    llama_token  *  token;
    float        *  embd;
    llama_pos    *  pos;
    int32_t      *  n_seq_id;
    llama_seq_id ** seq_id;
    int8_t       *  logits;
} llama_batch;

struct llama_embd {
    const float * data;
    size_t n_rows;
    size_t n_embd;
};

struct llama_model_params {
    int32_t n_gpu_layers;
    bool vocab_only;
    bool check_tensors;
    bool load_mtp;
    ...;
};

struct llama_context_params {
    uint32_t n_ctx;
    uint32_t n_batch;
    uint32_t n_ubatch;
    uint32_t n_seq_max;
    uint32_t n_rs_seq;
    uint32_t n_outputs_max;
    uint32_t n_outputs_max_per_seq;
    int32_t  n_threads;
    int32_t  n_threads_batch;
    enum llama_flash_attn_type flash_attn_type;
    bool embeddings;
    bool no_perf;
    bool kv_unified;
    struct llama_context * ctx_other;
    enum llama_context_type ctx_type;
    ...;
};

const char * llama_version(void);
const char * llama_print_system_info(void);

struct llama_model_params   llama_model_default_params(void);
struct llama_context_params llama_context_default_params(void);

void llama_backend_init(void);
void llama_backend_free(void);

struct llama_model * llama_model_load_from_file(const char * path_model, struct llama_model_params params);
void                 llama_model_free(struct llama_model * model);

struct llama_context * llama_init_from_model(struct llama_model * model, struct llama_context_params params);
void                   llama_free(struct llama_context * ctx);

uint32_t llama_n_ctx    (const struct llama_context * ctx);
uint32_t llama_n_ctx_seq   (const struct llama_context * ctx);
uint32_t llama_n_batch  (const struct llama_context * ctx);
uint32_t llama_n_ubatch (const struct llama_context * ctx);
uint32_t llama_n_seq_max(const struct llama_context * ctx);
uint32_t llama_n_rs_seq (const struct llama_context * ctx);

const struct llama_model * llama_get_model (const struct llama_context * ctx);
llama_memory_t             llama_get_memory(const struct llama_context * ctx);

const struct llama_vocab * llama_model_get_vocab(const struct llama_model * model);
enum llama_rope_type       llama_model_rope_type(const struct llama_model * model);

int32_t  llama_model_n_ctx_train(const struct llama_model * model);
int32_t  llama_model_n_embd     (const struct llama_model * model);
int32_t  llama_model_n_embd_inp (const struct llama_model * model);
int32_t  llama_model_n_layer    (const struct llama_model * model);
int32_t  llama_model_n_head     (const struct llama_model * model);
int32_t  llama_model_meta_val_str(const struct llama_model * model, const char * key, char * buf, size_t buf_size);
int32_t  llama_model_desc(const struct llama_model * model, char * buf, size_t buf_size);
uint64_t llama_model_n_params(const struct llama_model * model);
bool     llama_model_is_recurrent(const struct llama_model * model);
bool     llama_model_is_hybrid(const struct llama_model * model);

int32_t     llama_vocab_n_tokens(const struct llama_vocab * vocab);
llama_token llama_vocab_bos (const struct llama_vocab * vocab);
llama_token llama_vocab_eos (const struct llama_vocab * vocab);
llama_token llama_vocab_mask(const struct llama_vocab * vocab);

int32_t llama_tokenize(const struct llama_vocab * vocab, const char * text, int32_t text_len,
                       llama_token * tokens, int32_t n_tokens_max, bool add_special, bool parse_special);
int32_t llama_token_to_piece(const struct llama_vocab * vocab, llama_token token, char * buf,
                             int32_t length, int32_t lstrip, bool special);

/* memory */
void      llama_memory_clear      (llama_memory_t mem, bool data);
bool      llama_memory_seq_rm     (llama_memory_t mem, llama_seq_id seq_id, llama_pos p0, llama_pos p1);
llama_pos llama_memory_seq_pos_min(llama_memory_t mem, llama_seq_id seq_id);
llama_pos llama_memory_seq_pos_max(llama_memory_t mem, llama_seq_id seq_id);

/* per-sequence state */
size_t llama_state_seq_get_size(struct llama_context * ctx, llama_seq_id seq_id);
size_t llama_state_seq_get_data(struct llama_context * ctx, uint8_t * dst, size_t size, llama_seq_id seq_id);
size_t llama_state_seq_set_data(struct llama_context * ctx, const uint8_t * src, size_t size, llama_seq_id dest_seq_id);

/* classic batch */
struct llama_batch llama_batch_init(int32_t n_tokens, int32_t embd, int32_t n_seq_max);
void               llama_batch_free(struct llama_batch batch);
int32_t            llama_decode(struct llama_context * ctx, struct llama_batch batch);

/* extended batch (what llama-server, libcommon and mtmd use) */
struct llama_batch_ext * llama_batch_ext_init (struct llama_context * ctx);
void                     llama_batch_ext_free (struct llama_batch_ext * batch);
void                     llama_batch_ext_clear(struct llama_batch_ext * batch);
int32_t llama_batch_ext_add_token(struct llama_batch_ext * batch, llama_seq_id seq_id, llama_token id);
int32_t llama_batch_ext_add_embd (struct llama_batch_ext * batch, llama_seq_id seq_id, struct llama_embd embd);
bool    llama_batch_ext_add_seq  (struct llama_batch_ext * batch, int32_t idx, llama_seq_id seq_id);
bool    llama_batch_ext_set_output_logits(struct llama_batch_ext * batch, int32_t idx, bool value);
bool    llama_batch_ext_set_pos  (struct llama_batch_ext * batch, int32_t idx, const llama_pos * pos);
int32_t llama_process(struct llama_context * ctx, enum llama_process_type type, struct llama_batch_ext * batch);

/* attention / outputs */
void    llama_set_causal_attn(struct llama_context * ctx, bool causal_attn);
bool    llama_get_causal_attn(const struct llama_context * ctx);
void    llama_set_n_threads(struct llama_context * ctx, int32_t n_threads, int32_t n_threads_batch);
void    llama_synchronize(struct llama_context * ctx);
float * llama_get_logits_ith(struct llama_context * ctx, int32_t i);
float * llama_get_embeddings_ith(struct llama_context * ctx, int32_t i);

/* logs */
void llama_log_set(ggml_log_callback log_callback, void * user_data);
