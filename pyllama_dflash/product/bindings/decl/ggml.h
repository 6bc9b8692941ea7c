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

/* ggml-backend.h: the devices the loaded backends registered (the CUDA build without a GPU has none) */
enum ggml_backend_dev_type {
    GGML_BACKEND_DEVICE_TYPE_CPU,
    GGML_BACKEND_DEVICE_TYPE_GPU,
    GGML_BACKEND_DEVICE_TYPE_IGPU,
    GGML_BACKEND_DEVICE_TYPE_ACCEL,
    GGML_BACKEND_DEVICE_TYPE_META,
    ...
};

size_t                     ggml_backend_dev_count(void);
ggml_backend_dev_t         ggml_backend_dev_get(size_t index);
const char *               ggml_backend_dev_name(ggml_backend_dev_t device);
const char *               ggml_backend_dev_description(ggml_backend_dev_t device);
enum ggml_backend_dev_type ggml_backend_dev_type(ggml_backend_dev_t device);
