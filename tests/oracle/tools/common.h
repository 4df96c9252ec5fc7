// Small helpers shared by the oracle tools: file I/O and model loading with the settings the
// comparisons need (CPU only, F32 KV cache, flash attention off).
#pragma once
#include "llama.h"
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

[[noreturn]] inline void die(const std::string & msg) {
    fprintf(stderr, "error: %s\n", msg.c_str());
    exit(1);
}

inline std::vector<int32_t> read_i32(const char * path) {
    FILE * f = fopen(path, "rb");
    if (!f) die(std::string("could not open token file ") + path);
    std::vector<int32_t> out;
    int32_t v;
    while (fread(&v, sizeof v, 1, f) == 1) out.push_back(v);
    fclose(f);
    return out;
}

inline void write_bytes(const char * path, const void * data, size_t n) {
    FILE * f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n) die(std::string("could not write ") + path);
    fclose(f);
}

inline llama_model * load_model(const char * path, bool vocab_only) {
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    mp.vocab_only = vocab_only;
    llama_model * m = llama_model_load_from_file(path, mp);
    if (!m) die(std::string("could not load model ") + path);
    return m;
}

// F32 KV and no flash attention: the default F16 cache alone moves logits by ~5e-3 relative.
inline llama_context * make_context(llama_model * m, uint32_t n_ctx, int n_threads) {
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = cp.n_batch = cp.n_ubatch = n_ctx < 64 ? 64 : n_ctx;
    cp.n_threads = cp.n_threads_batch = n_threads;
    cp.type_k = GGML_TYPE_F32;
    cp.type_v = GGML_TYPE_F32;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.no_perf = true;
    llama_context * ctx = llama_init_from_model(m, cp);
    if (!ctx) die("could not create a llama context");
    return ctx;
}

// One batch of tokens at positions pos0.., asking for logits at every position when all_logits.
inline void decode(llama_context * ctx, const std::vector<int32_t> & toks, int pos0, bool all_logits) {
    llama_batch b = llama_batch_init((int32_t) toks.size(), 0, 1);
    for (size_t i = 0; i < toks.size(); i++) {
        b.token[i] = toks[i];
        b.pos[i] = pos0 + (int) i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = all_logits || i + 1 == toks.size();
    }
    b.n_tokens = (int32_t) toks.size();
    int rc = llama_decode(ctx, b);
    llama_batch_free(b);
    if (rc != 0) die("llama_decode failed with code " + std::to_string(rc));
}

// Records of [uint32 little-endian length][bytes]: texts may hold any byte, newlines included.
inline std::vector<std::string> read_records(const char * path) {
    FILE * f = fopen(path, "rb");
    if (!f) die(std::string("could not open record file ") + path);
    std::vector<std::string> out;
    uint32_t n;
    while (fread(&n, sizeof n, 1, f) == 1) {
        std::string s(n, '\0');
        if (n && fread(&s[0], 1, n, f) != n) die(std::string("truncated record in ") + path);
        out.push_back(s);
    }
    fclose(f);
    return out;
}
