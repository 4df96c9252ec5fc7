// quantize IN.gguf OUT.gguf TYPE [threads [pure]]
// llama_model_quantize() with default parameters, which is what llama-quantize does without
// extra flags (with "pure": llama-quantize --pure, every weight TYPE where its rows fit); avoids building
// llama-common (several minutes on 2 cores).
#include "common.h"
#include <cstring>

struct ftype_name { const char * name; llama_ftype ftype; };
static const ftype_name FTYPES[] = {
    {"F32", LLAMA_FTYPE_ALL_F32}, {"F16", LLAMA_FTYPE_MOSTLY_F16}, {"BF16", LLAMA_FTYPE_MOSTLY_BF16},
    {"Q8_0", LLAMA_FTYPE_MOSTLY_Q8_0}, {"Q4_0", LLAMA_FTYPE_MOSTLY_Q4_0}, {"Q4_1", LLAMA_FTYPE_MOSTLY_Q4_1},
    {"Q5_0", LLAMA_FTYPE_MOSTLY_Q5_0}, {"Q5_1", LLAMA_FTYPE_MOSTLY_Q5_1}, {"Q2_K", LLAMA_FTYPE_MOSTLY_Q2_K},
    {"Q2_K_S", LLAMA_FTYPE_MOSTLY_Q2_K_S}, {"Q3_K_S", LLAMA_FTYPE_MOSTLY_Q3_K_S},
    {"Q3_K_M", LLAMA_FTYPE_MOSTLY_Q3_K_M}, {"Q3_K_L", LLAMA_FTYPE_MOSTLY_Q3_K_L},
    {"Q4_K_S", LLAMA_FTYPE_MOSTLY_Q4_K_S}, {"Q4_K_M", LLAMA_FTYPE_MOSTLY_Q4_K_M},
    {"Q5_K_S", LLAMA_FTYPE_MOSTLY_Q5_K_S}, {"Q5_K_M", LLAMA_FTYPE_MOSTLY_Q5_K_M},
    {"Q6_K", LLAMA_FTYPE_MOSTLY_Q6_K}, {"IQ4_NL", LLAMA_FTYPE_MOSTLY_IQ4_NL},
    {"IQ4_XS", LLAMA_FTYPE_MOSTLY_IQ4_XS}, {"TQ1_0", LLAMA_FTYPE_MOSTLY_TQ1_0},
    {"TQ2_0", LLAMA_FTYPE_MOSTLY_TQ2_0}, {"MXFP4_MOE", LLAMA_FTYPE_MOSTLY_MXFP4_MOE},
};

int main(int argc, char ** argv) {
    if (argc < 4) die("usage: quantize IN.gguf OUT.gguf TYPE [threads]");
    llama_model_quantize_params qp = llama_model_quantize_default_params();
    bool found = false;
    for (const ftype_name & f : FTYPES) {
        if (strcmp(f.name, argv[3]) == 0) { qp.ftype = f.ftype; found = true; }
    }
    if (!found) {
        std::string names;
        for (const ftype_name & f : FTYPES) names += std::string(" ") + f.name;
        die(std::string("unknown quant type ") + argv[3] + "; known:" + names);
    }
    qp.nthread = argc > 4 ? atoi(argv[4]) : 2;
    qp.pure = argc > 5 && strcmp(argv[5], "pure") == 0;
    llama_backend_init();
    if (llama_model_quantize(argv[1], argv[2], &qp) != 0) die(std::string("could not quantize ") + argv[1]);
    return 0;
}
