// dump_logits MODEL.gguf TOKENS.i32 OUT.f32 [threads]
// Logits for every position of one sequence: OUT is float32 [n_tokens, n_vocab], row-major.
#include "common.h"

int main(int argc, char ** argv) {
    if (argc < 4) die("usage: dump_logits MODEL.gguf TOKENS.i32 OUT.f32 [threads]");
    int n_threads = argc > 4 ? atoi(argv[4]) : 2;
    std::vector<int32_t> toks = read_i32(argv[2]);
    if (toks.empty()) die("token file is empty");
    llama_model * model = load_model(argv[1], false);
    llama_context * ctx = make_context(model, (uint32_t) toks.size(), n_threads);
    decode(ctx, toks, 0, true);
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    std::vector<float> out;
    out.reserve(toks.size() * (size_t) n_vocab);
    for (size_t i = 0; i < toks.size(); i++) {
        const float * row = llama_get_logits_ith(ctx, (int32_t) i);
        out.insert(out.end(), row, row + n_vocab);
    }
    write_bytes(argv[3], out.data(), out.size() * sizeof(float));
    fprintf(stderr, "wrote %zu x %d logits\n", toks.size(), n_vocab);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
