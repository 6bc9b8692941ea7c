/* mtmd.h + mtmd-helper.h (b11434), curated: projector init, RGB bitmaps, tokenize into chunks,
 * chunk/image accessors, encode, and the image-chunk decode helper with its post-decode callback. */

enum mtmd_input_chunk_type {
    MTMD_INPUT_CHUNK_TYPE_TEXT,
    MTMD_INPUT_CHUNK_TYPE_IMAGE,
    MTMD_INPUT_CHUNK_TYPE_AUDIO,
    ...
};

typedef struct mtmd_context      mtmd_context;
typedef struct mtmd_bitmap       mtmd_bitmap;
typedef struct mtmd_image_tokens mtmd_image_tokens;
typedef struct mtmd_input_chunk  mtmd_input_chunk;
typedef struct mtmd_input_chunks mtmd_input_chunks;

typedef struct mtmd_input_text {
    const char * text;
    size_t text_len;
    bool add_special;
    bool parse_special;
} mtmd_input_text;

struct mtmd_context_params {
    bool use_gpu;
    bool print_timings;
    int n_threads;
    const char * media_marker;
    enum llama_flash_attn_type flash_attn_type;
    bool warmup;
    int image_min_tokens;
    int image_max_tokens;
    int32_t batch_max_tokens;
    ...;
};

struct mtmd_decoder_pos {
    uint32_t t;
    uint32_t x;
    uint32_t y;
    uint32_t z;
    ...;
};

const char * mtmd_default_marker(void);
struct mtmd_context_params mtmd_context_params_default(void);

mtmd_context * mtmd_init_from_file(const char * mmproj_fname, const struct llama_model * text_model,
                                   const struct mtmd_context_params ctx_params);
void mtmd_free(mtmd_context * ctx);

bool mtmd_decode_use_non_causal(const mtmd_context * ctx, const mtmd_input_chunk * chunk);
bool mtmd_decode_use_mrope(const mtmd_context * ctx);
bool mtmd_support_vision(const mtmd_context * ctx);

mtmd_bitmap * mtmd_bitmap_init(uint32_t nx, uint32_t ny, const unsigned char * data);
uint32_t      mtmd_bitmap_get_nx(const mtmd_bitmap * bitmap);
uint32_t      mtmd_bitmap_get_ny(const mtmd_bitmap * bitmap);
void          mtmd_bitmap_free(mtmd_bitmap * bitmap);

mtmd_input_chunks *      mtmd_input_chunks_init(void);
size_t                   mtmd_input_chunks_size(const mtmd_input_chunks * chunks);
const mtmd_input_chunk * mtmd_input_chunks_get (const mtmd_input_chunks * chunks, size_t idx);
void                     mtmd_input_chunks_free(mtmd_input_chunks * chunks);

enum mtmd_input_chunk_type mtmd_input_chunk_get_type(const mtmd_input_chunk * chunk);
const llama_token *        mtmd_input_chunk_get_tokens_text(const mtmd_input_chunk * chunk, size_t * n_tokens_output);
const mtmd_image_tokens *  mtmd_input_chunk_get_tokens_image(const mtmd_input_chunk * chunk);
size_t                     mtmd_input_chunk_get_n_tokens(const mtmd_input_chunk * chunk);
llama_pos                  mtmd_input_chunk_get_n_pos(const mtmd_input_chunk * chunk);

size_t    mtmd_image_tokens_get_n_tokens(const mtmd_image_tokens * image_tokens);
llama_pos mtmd_image_tokens_get_n_pos(const mtmd_image_tokens * image_tokens);
/* nx/ny are deprecated upstream; see header_adapters.py for how the warning is contained. */
size_t    pyllama_dflash_image_tokens_nx(const mtmd_image_tokens * image_tokens);
size_t    pyllama_dflash_image_tokens_ny(const mtmd_image_tokens * image_tokens);
struct mtmd_decoder_pos mtmd_image_tokens_get_decoder_pos(const mtmd_image_tokens * image_tokens, llama_pos pos_0, size_t i);

int32_t mtmd_tokenize(const mtmd_context * ctx, mtmd_input_chunks * output, const mtmd_input_text * text,
                      const mtmd_bitmap * const * bitmaps, size_t n_bitmaps);
int32_t mtmd_encode_chunk(mtmd_context * ctx, const mtmd_input_chunk * chunk);
float * mtmd_get_output_embd(mtmd_context * ctx);

void mtmd_log_set(ggml_log_callback log_callback, void * user_data);

/* mtmd-helper.h */
void mtmd_helper_log_set(ggml_log_callback log_callback, void * user_data);

/* encoded images (PNG, JPEG, ...) decoded by mtmd's own reader, for real photos */
typedef struct mtmd_helper_video mtmd_helper_video;
struct mtmd_helper_video_init_params {
    float fps_target;
    const char * ffmpeg_bin_dir;
    int64_t timestamp_interval_ms;
    ...;
};
struct mtmd_helper_init_opt {
    struct mtmd_helper_video_init_params video_params;
    ...;
};
struct mtmd_helper_bitmap_wrapper {
    mtmd_bitmap * bitmap;
    mtmd_helper_video * video_ctx;
    ...;
};
struct mtmd_helper_init_opt mtmd_helper_init_opt_default(void);
struct mtmd_helper_bitmap_wrapper mtmd_helper_bitmap_init_from_buf(const mtmd_context * ctx, const unsigned char * buf,
                                                                   size_t len, bool placeholder,
                                                                   struct mtmd_helper_init_opt opt);
void mtmd_helper_video_free(mtmd_helper_video * ctx);

struct mtmd_helper_embd_batch {
    int32_t n_tokens;
    const float     * embd;
    int32_t           n_embd;
    const llama_pos * pos;      /* [n_pos, n_tokens], section-major */
    int32_t           n_pos;
    llama_seq_id      seq_id;
    ...;
};

typedef int32_t (*mtmd_helper_post_decode_callback)(const struct mtmd_helper_embd_batch * batch, void * user_data);

int32_t mtmd_helper_decode_image_chunk(mtmd_context * ctx, struct llama_context * lctx, const mtmd_input_chunk * chunk,
                                       float * encoded_embd, llama_pos n_past, llama_seq_id seq_id, int32_t n_batch,
                                       llama_pos * new_n_past, mtmd_helper_post_decode_callback callback, void * user_data);
int32_t mtmd_helper_eval_chunk_single(mtmd_context * ctx, struct llama_context * lctx, const mtmd_input_chunk * chunk,
                                      llama_pos n_past, llama_seq_id seq_id, int32_t n_batch, bool logits_last,
                                      llama_pos * new_n_past);
