/* Python-side callbacks (cffi extern "Python"): defined in pyllama_dflash/product/bindings/callbacks.py. */

extern "Python" void pyllama_dflash_on_llama_log(enum ggml_log_level level, const char * text, void * user_data);
extern "Python" void pyllama_dflash_on_mtmd_log(enum ggml_log_level level, const char * text, void * user_data);
extern "Python" int32_t pyllama_dflash_on_image_batch(const struct mtmd_helper_embd_batch * batch, void * user_data);
