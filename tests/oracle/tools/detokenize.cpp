// detokenize MODEL.gguf IDS.txt OUT.rec REMOVE_SPECIAL(0|1) UNPARSE_SPECIAL(0|1)
// Each input line of token ids becomes one [uint32 length][bytes] record of text.
#include "common.h"
#include <sstream>

int main(int argc, char ** argv) {
    if (argc < 6) die("usage: detokenize MODEL.gguf IDS.txt OUT.rec REMOVE_SPECIAL UNPARSE_SPECIAL");
    const bool remove_special = atoi(argv[4]) != 0, unparse_special = atoi(argv[5]) != 0;
    llama_model * model = load_model(argv[1], true);
    const llama_vocab * vocab = llama_model_get_vocab(model);
    FILE * in = fopen(argv[2], "r");
    FILE * o = fopen(argv[3], "wb");
    if (!in || !o) die("could not open input or output file");
    char line[1 << 16];
    while (fgets(line, sizeof line, in)) {
        std::istringstream ss(line);
        std::vector<llama_token> ids;
        for (int32_t id; ss >> id;) ids.push_back(id);
        int32_t n = -llama_detokenize(vocab, ids.data(), (int32_t) ids.size(), nullptr, 0, remove_special, unparse_special);
        std::string text(n > 0 ? n : 0, '\0');
        if (n > 0) n = llama_detokenize(vocab, ids.data(), (int32_t) ids.size(), &text[0], n, remove_special, unparse_special);
        uint32_t len = (uint32_t) text.size();
        fwrite(&len, sizeof len, 1, o);
        fwrite(text.data(), 1, len, o);
    }
    fclose(in);
    fclose(o);
    llama_model_free(model);
    return 0;
}
