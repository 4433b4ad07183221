// bloomery-llama-spec: llama.cpp's own greedy decoding, plain or speculative, over prompts given as token ids.
//
// Why a driver of our own: llama.cpp's speculative examples take a text prompt (tokenised by llama.cpp's own
// pre-tokenizer, which differs from the HF tokenizer the gate uses) and print text, not ids. The gate compares
// engines on token ids. Everything that decides a token is llama.cpp's: the target and draft graphs
// (llama_process), the drafters (common_speculative_*: draft-mtp, draft-dflash, draft-dspark, draft-eagle3, ...),
// the verification (common_sampler_sample_and_accept_n) and the checkpoint/rollback of a target whose memory
// cannot drop a partial sequence (hybrid recurrent targets). The loop is the one llama.cpp's
// examples/speculative-simple runs, per prompt, with the KV memory cleared between prompts.
//
// Usage: bloomery-llama-spec --bl-prompts IDS.txt --bl-out OUT.jsonl [--bl-plain] [--bl-n N] [--bl-logits K
//        --bl-logits-out F.f32] <llama.cpp common flags: -m, -md, --spec-type, --spec-draft-n-max, -c, -ngl, ...>
//   IDS.txt: one prompt a line, its token ids separated by spaces.
//   OUT.jsonl: one object a prompt: {"prompt", "mode", "ids" (the N emitted ids), "windows" ([[proposed,
//   accepted, emitted, [draft ids]], ...] per verify window: how many tokens the drafter proposed, how many the
//   first verification kept, the ids the window emitted, the proposed ids themselves), "reverify" (windows whose partial accept made llama.cpp
//   restore a checkpoint and verify the kept ids again), "n_drafted" / "n_accept" (speculative-simple's own
//   counters, which count a re-verified prefix as a fully accepted draft)}.
//   --bl-logits K: for prompt 0 of a plain run, the logits of the first K emitted positions as raw float32 [K, V].

#include "arg.h"
#include "common.h"
#include "llama.h"
#include "log.h"
#include "sampling.h"
#include "speculative.h"

#include <clocale>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

struct driver_args {
    std::string prompts, out, logits_out;
    bool plain = false;
    int n = 256;
    int logits = 0;
};

// Take our own --bl-* flags out of argv; the rest goes to llama.cpp's parser.
static bool take_args(int & argc, char ** argv, driver_args & a) {
    int w = 1;
    for (int i = 1; i < argc; ++i) {
        std::string k = argv[i];
        auto val = [&](std::string & dst) {
            if (i + 1 >= argc) { fprintf(stderr, "error: %s needs a value\n", k.c_str()); return false; }
            dst = argv[++i];
            return true;
        };
        std::string v;
        if (k == "--bl-prompts") { if (!val(a.prompts)) return false; }
        else if (k == "--bl-out") { if (!val(a.out)) return false; }
        else if (k == "--bl-logits-out") { if (!val(a.logits_out)) return false; }
        else if (k == "--bl-plain") { a.plain = true; }
        else if (k == "--bl-n") { if (!val(v)) return false; a.n = std::stoi(v); }
        else if (k == "--bl-logits") { if (!val(v)) return false; a.logits = std::stoi(v); }
        else { argv[w++] = argv[i]; }
    }
    argc = w;
    if (a.prompts.empty() || a.out.empty() || a.n < 1) {
        fprintf(stderr, "error: --bl-prompts FILE, --bl-out FILE and --bl-n >= 1 are required\n");
        return false;
    }
    return true;
}

static std::vector<llama_tokens> read_prompts(const std::string & path) {
    std::vector<llama_tokens> out;
    std::ifstream f(path);
    std::string line;
    while (std::getline(f, line)) {
        std::istringstream s(line);
        llama_tokens p;
        long long id;
        while (s >> id) p.push_back((llama_token) id);
        if (!p.empty()) out.push_back(p);
    }
    return out;
}

struct window { size_t proposed, accepted, emitted; llama_tokens drafts; };

struct run_out {
    llama_tokens ids;
    std::vector<window> windows;
    int reverify = 0, n_drafted = 0, n_accept = 0;
};

// One prompt, greedy, n ids. spec == nullptr: plain decoding (one row a step). logits: rows appended for the
// first `want_logits` emitted positions (plain runs only).
static bool run_prompt(common_params & params, llama_context * ctx_tgt, llama_context * ctx_dft,
                       common_speculative * spec, const llama_tokens & inp, int n, run_out & r,
                       std::vector<float> * logits, int want_logits) {
    const llama_seq_id seq = 0;
    llama_memory_clear(llama_get_memory(ctx_tgt), true);
    if (ctx_dft) llama_memory_clear(llama_get_memory(ctx_dft), true);

    const bool ckpt_tgt = common_context_can_seq_rm(ctx_tgt) == COMMON_CONTEXT_SEQ_RM_TYPE_FULL;
    const bool ckpt_dft = ctx_dft && common_context_can_seq_rm(ctx_dft) == COMMON_CONTEXT_SEQ_RM_TYPE_FULL;
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(llama_get_model(ctx_tgt)));

    common_sampler_ptr smpl(common_sampler_init(llama_get_model(ctx_tgt), params.sampling));

    common_batch batch_prompt(ctx_tgt);
    for (size_t i = 0; i + 1 < inp.size(); ++i) batch_prompt.add(inp[i], (llama_pos) i, seq, false);
    if (inp.size() > 1 && llama_process(ctx_tgt, LLAMA_PROCESS_TYPE_DECODE, batch_prompt.get()) != 0) {
        fprintf(stderr, "error: the prompt's decode failed\n");
        return false;
    }
    if (spec && !common_speculative_process(spec, batch_prompt)) {
        fprintf(stderr, "error: the drafter could not process the prompt\n");
        return false;
    }
    llama_token id_last = inp.back();
    llama_tokens committed(inp.begin(), inp.end() - 1);
    int n_past = (int) inp.size() - 1;
    if (spec) common_speculative_begin(spec, seq, committed);

    common_batch batch(ctx_tgt);
    llama_tokens draft;
    common_prompt_checkpoint ckpt;
    window open{0, 0, 0, {}};
    bool reverifying = false;

    while ((int) r.ids.size() < n) {
        if (draft.empty() && spec) {
            ckpt.update_pos((int64_t) committed.size(), llama_memory_seq_pos_min(llama_get_memory(ctx_tgt), seq),
                            llama_memory_seq_pos_max(llama_get_memory(ctx_tgt), seq));
            if (ckpt_dft) ckpt.update_dft(ctx_dft, seq, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
            int n_max = std::max(0, std::min((int) llama_n_ctx(ctx_tgt) - n_past - 2, n - (int) r.ids.size() - 1));
            common_speculative_get_draft_params(spec, seq) = {true, n_max, n_past, id_last, &committed, &draft};
            common_speculative_draft(spec);
            if (!draft.empty() && ckpt_tgt) ckpt.update_tgt(ctx_tgt, seq, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
            if (ctx_dft) {
                if (ckpt_dft) ckpt.load_dft(ctx_dft, seq, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
                llama_memory_seq_rm(llama_get_memory(ctx_dft), seq, ckpt.pos_max + 1, -1);
            }
            open = {draft.size(), 0, 0, draft};
            reverifying = false;
        } else if (draft.empty()) {
            open = {0, 0, 0, {}};
        }
        batch.clear();
        batch.add(id_last, n_past++, seq, true);
        for (size_t i = 0; i < draft.size(); ++i) batch.add(draft[i], n_past + (llama_pos) i, seq, true);
        if (llama_process(ctx_tgt, LLAMA_PROCESS_TYPE_DECODE, batch.get()) != 0) {
            fprintf(stderr, "error: a verify decode failed\n");
            return false;
        }
        if (logits && (int) r.ids.size() < want_logits) {
            const float * row = llama_get_logits_ith(ctx_tgt, -1);
            logits->insert(logits->end(), row, row + n_vocab);
        }
        if (spec && !common_speculative_process(spec, batch)) {
            fprintf(stderr, "error: the drafter could not process a verify batch\n");
            return false;
        }
        common_sampler_ptr smpl_save;
        if (ckpt_tgt && spec) smpl_save.reset(common_sampler_clone(smpl.get()));
        const size_t n_draft = draft.size();
        llama_tokens ids = common_sampler_sample_and_accept_n(smpl.get(), ctx_tgt, draft);
        if (!reverifying) open.accepted = ids.size() - 1;
        if (spec && ckpt_tgt && ids.size() - 1 < n_draft) {
            // partial accept on a target that cannot drop a partial sequence: restore, verify the kept ids again
            draft = std::move(ids);
            ckpt.load_tgt(ctx_tgt, seq, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
            llama_memory_seq_rm(llama_get_memory(ctx_tgt), seq, ckpt.pos_max + 1, -1);
            if (ctx_dft) {
                ckpt.load_dft(ctx_dft, seq, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
                llama_memory_seq_rm(llama_get_memory(ctx_dft), seq, ckpt.pos_max + 1, -1);
            }
            committed.resize(ckpt.n_tokens);
            smpl = std::move(smpl_save);
            n_past = (int) committed.size();
            r.reverify += 1;
            reverifying = true;
            continue;
        }
        if (spec) common_speculative_accept(spec, seq, (uint16_t) (ids.size() - 1));
        n_past += (int) ids.size() - 1;
        r.n_drafted += (int) n_draft;
        r.n_accept += (int) ids.size() - 1;
        open.emitted = ids.size();
        r.windows.push_back(open);
        for (llama_token id : ids) {
            committed.push_back(id_last);
            id_last = id;
            r.ids.push_back(id);
        }
        draft.clear();
        llama_memory_seq_rm(llama_get_memory(ctx_tgt), seq, n_past, -1);
        if (ctx_dft) llama_memory_seq_rm(llama_get_memory(ctx_dft), seq, n_past, -1);
    }
    return true;
}

static void write_json(FILE * f, int prompt, bool plain, const run_out & r, int n) {
    fprintf(f, "{\"prompt\": %d, \"mode\": \"%s\", \"ids\": [", prompt, plain ? "plain" : "spec");
    for (int i = 0; i < n && i < (int) r.ids.size(); ++i) fprintf(f, "%s%d", i ? ", " : "", r.ids[i]);
    fprintf(f, "], \"windows\": [");
    for (size_t i = 0; i < r.windows.size(); ++i) {
        const window & w = r.windows[i];
        fprintf(f, "%s[%zu, %zu, %zu, [", i ? ", " : "", w.proposed, w.accepted, w.emitted);
        for (size_t j = 0; j < w.drafts.size(); ++j) fprintf(f, "%s%d", j ? ", " : "", w.drafts[j]);
        fprintf(f, "]]");
    }
    fprintf(f, "], \"reverify\": %d, \"n_drafted\": %d, \"n_accept\": %d}\n", r.reverify, r.n_drafted, r.n_accept);
}

int main(int argc, char ** argv) {
    std::setlocale(LC_NUMERIC, "C");
    driver_args a;
    if (!take_args(argc, argv, a)) return 2;
    common_params params;
    common_init();
    if (!common_params_parse(argc, argv, params, LLAMA_EXAMPLE_SPECULATIVE)) return 2;
    const auto limits = common_speculative_get_output_limits(params.n_batch, params.n_parallel,
                                                             common_speculative_n_max(&params.speculative));
    params.n_outputs_max = limits.total;
    params.n_outputs_max_per_seq = limits.per_seq;

    const auto prompts = read_prompts(a.prompts);
    if (prompts.empty()) { fprintf(stderr, "error: %s holds no prompt\n", a.prompts.c_str()); return 2; }

    llama_backend_init();
    auto init = common_init_from_params(params);
    llama_model * model = init->model();
    llama_context * ctx_tgt = init->context();
    if (!model || !ctx_tgt) { fprintf(stderr, "error: the target did not load\n"); return 2; }

    common_speculative_init_result_ptr spec_init;
    llama_context * ctx_dft = nullptr;
    if (!a.plain) {
        common_params params_dft = common_base_params_to_speculative(params);
        spec_init = common_speculative_init_from_params(params_dft, model, ctx_tgt);
        params.speculative.draft.ctx_tgt = ctx_tgt;
        params.speculative.draft.ctx_dft = spec_init->context();
        ctx_dft = params.speculative.draft.ctx_dft;
    }

    FILE * out = fopen(a.out.c_str(), "w");
    if (!out) { fprintf(stderr, "error: cannot write %s\n", a.out.c_str()); return 2; }
    std::vector<float> logits;
    for (size_t p = 0; p < prompts.size(); ++p) {
        common_speculative_ptr spec;
        if (!a.plain) {
            spec.reset(common_speculative_init(params.speculative, 1));
            if (!spec) { fprintf(stderr, "error: llama.cpp could not start its speculative decoding\n"); return 3; }
        }
        run_out r;
        const bool want = a.plain && p == 0 && a.logits > 0;
        if (!run_prompt(params, ctx_tgt, ctx_dft, spec.get(), prompts[p], a.n, r, want ? &logits : nullptr,
                        a.logits)) {
            return 3;
        }
        write_json(out, (int) p, a.plain, r, a.n);
        fflush(out);
        fprintf(stderr, "bloomery-llama-spec: prompt %zu of %zu done\n", p + 1, prompts.size());
    }
    fclose(out);
    if (!a.logits_out.empty() && !logits.empty()) {
        FILE * f = fopen(a.logits_out.c_str(), "wb");
        if (!f) { fprintf(stderr, "error: cannot write %s\n", a.logits_out.c_str()); return 2; }
        fwrite(logits.data(), sizeof(float), logits.size(), f);
        fclose(f);
    }
    llama_backend_free();
    return 0;
}
