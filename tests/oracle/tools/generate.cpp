// generate MODEL.gguf PROMPT.i32 N OUT.i32 [threads] [stop_at_eog=1]
// Greedy continuation, one token per llama_decode after the prompt (the incremental path).
// Ties go to the lowest id, the same rule as torch.argmax.
#include "common.h"

static int32_t argmax(const float * row, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++) if (row[i] > row[best]) best = i;
    return best;
}

int main(int argc, char ** argv) {
    if (argc < 5) die("usage: generate MODEL.gguf PROMPT.i32 N OUT.i32 [threads] [stop_at_eog=1]");
    const int n_new = atoi(argv[3]);
    const int n_threads = argc > 5 ? atoi(argv[5]) : 2;
    const bool stop_at_eog = argc > 6 ? atoi(argv[6]) != 0 : true;
    std::vector<int32_t> prompt = read_i32(argv[2]);
    if (prompt.empty()) die("prompt file is empty");
    llama_model * model = load_model(argv[1], false);
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);
    llama_context * ctx = make_context(model, (uint32_t) (prompt.size() + n_new), n_threads);
    decode(ctx, prompt, 0, false);
    std::vector<int32_t> out;
    int pos = (int) prompt.size();
    for (int i = 0; i < n_new; i++) {
        int32_t tok = argmax(llama_get_logits_ith(ctx, -1), n_vocab);
        out.push_back(tok);
        if (stop_at_eog && llama_vocab_is_eog(vocab, tok)) break;
        decode(ctx, {tok}, pos++, false);
    }
    write_bytes(argv[4], out.data(), out.size() * sizeof(int32_t));
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
