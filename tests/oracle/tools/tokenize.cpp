// tokenize MODEL.gguf TEXTS.rec OUT.txt ADD_SPECIAL(0|1) PARSE_SPECIAL(0|1)
// One line of space-separated token ids per input text. Loads the vocabulary only.
#include "common.h"

int main(int argc, char ** argv) {
    if (argc < 6) die("usage: tokenize MODEL.gguf TEXTS.rec OUT.txt ADD_SPECIAL PARSE_SPECIAL");
    const bool add_special = atoi(argv[4]) != 0, parse_special = atoi(argv[5]) != 0;
    llama_model * model = load_model(argv[1], true);
    const llama_vocab * vocab = llama_model_get_vocab(model);
    FILE * o = fopen(argv[3], "w");
    if (!o) die(std::string("could not open ") + argv[3]);
    for (const std::string & text : read_records(argv[2])) {
        int32_t n = -llama_tokenize(vocab, text.data(), (int32_t) text.size(), nullptr, 0, add_special, parse_special);
        std::vector<llama_token> ids(n > 0 ? n : 0);
        if (n > 0) n = llama_tokenize(vocab, text.data(), (int32_t) text.size(), ids.data(), n, add_special, parse_special);
        for (int32_t i = 0; i < (int32_t) ids.size(); i++) fprintf(o, i ? " %d" : "%d", ids[i]);
        fputc('\n', o);
    }
    fclose(o);
    llama_model_free(model);
    return 0;
}
