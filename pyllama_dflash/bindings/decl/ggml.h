/* ggml: only what llama.h / mtmd.h signatures we bind need (log callback, opaque handles). */

#define GGML_MROPE_SECTIONS ...

enum ggml_log_level {
    GGML_LOG_LEVEL_NONE,
    GGML_LOG_LEVEL_DEBUG,
    GGML_LOG_LEVEL_INFO,
    GGML_LOG_LEVEL_WARN,
    GGML_LOG_LEVEL_ERROR,
    GGML_LOG_LEVEL_CONT,
    ...
};

typedef void (*ggml_log_callback)(enum ggml_log_level level, const char * text, void * user_data);

typedef struct ggml_backend_device * ggml_backend_dev_t;
