// test/trainer_ranks.h — what the trainers' rank tests share: a binary that is both the test and the
// trainer it includes (started as `SELF --train-<model> ARGS...`, alone or under mpirun), and the
// multi-rank checks that hold the same way for every trainer (resume on as many ranks, re-shard onto
// more, a failing rank). Included after the trainer (train_gpt2.cu or train_bert.cu with TESTING).
#pragma once
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "harness.h"
#include "program_runs.h"

namespace ranks {

inline std::string self;  // this binary, which runs the trainer when given `flag` first
inline std::string flag;  // --train-gpt2 or --train-bert
inline std::string tmp;   // the test's scratch folder, removed at the end

// A run of the trainer: `n` processes under mpirun, or 0 for one process without it.
inline th::ChildOutput run(int n, const std::string& args) {
    return th::run_command(th::mpirun_prefix(n) + self + " " + flag + " " + args + " 2>&1");
}

// Largest |difference| of two runs' losses (infinite unless both have `n`).
inline double worst_diff(const std::vector<double>& a, const std::vector<double>& b, size_t n) {
    double worst = a.size() == n && b.size() == n ? 0 : INFINITY;
    for (size_t i = 0; i < a.size() && i < b.size(); i++) worst = std::max(worst, std::fabs(a[i] - b[i]));
    return worst;
}

// 2 ranks stopped after 3 of 6 steps and resumed, with sharded optimizer state: bit-identical to the
// uninterrupted run, every step's loss and the model and both state shards byte for byte. `args`
// sets the batch, ZeRO stage and checkpoint interval (-n 3); `tag` names the runs' folders.
inline void check_resume_same_world(const std::string& args, const std::string& tag, const char* name) {
    using th::exited_ok, th::last_lines, th::slurp, th::step_losses;
    std::string full = tmp + "/full" + tag, part = tmp + "/part" + tag;
    th::ChildOutput a = run(2, args + "-o " + full);
    th::ChildOutput b1 = run(2, args + "-o " + part + " --stop-after 3");
    th::ChildOutput b2 = run(2, args + "-o " + part + " -y");
    std::vector<double> la = step_losses(a.text), lb = step_losses(b1.text + "\n" + b2.text);
    bool same_files = true;
    std::string which;
    for (std::string f : {"/model_00000006.bin", "/state_00000006_00000.bin", "/state_00000006_00001.bin"})
        if (slurp(full + f) != slurp(part + f) || slurp(full + f).rfind("<missing", 0) == 0) {
            same_files = false;
            which += f + " ";
        }
    th::report(exited_ok(a) && exited_ok(b1) && exited_ok(b2) && la == lb && la.size() == 6 && same_files, name,
               "%zu losses equal: %s; model + 2 state shards identical: %s%s%s", la.size(), la == lb ? "yes" : "no",
               same_files ? "yes" : "no", same_files ? "" : (" (" + which + ")").c_str(),
               exited_ok(b2) ? "" : (" | " + last_lines(b2.text)).c_str());
}

// 2 ranks x B=3 stopped after 3 steps, resumed on 3 ranks x B=2: the state is re-sharded and the run
// goes on as the uninterrupted 2-rank run does (fp32 rounding apart: another split of the sums).
// Resuming with another ranks x B (3 x 1) is refused by name. `args`: the model, data and --zero 1.
inline void check_reshard_2_to_3(const std::string& args) {
    using th::exited_ok, th::last_lines, th::step_losses;
    std::string full = tmp + "/r_full", part = tmp + "/r_part";
    th::ChildOutput a = run(2, args + "-b 3 -o " + full);
    th::ChildOutput b1 = run(2, args + "-b 3 -o " + part + " --stop-after 3");
    th::ChildOutput bad = run(3, args + "-b 1 -o " + part + " -y");
    bool named = bad.text.find("--batch-size x ranks 3 x 2, this run has 1 x 3") != std::string::npos;
    th::report(!exited_ok(bad) && named, "resume on 3 ranks x B=1 after 2 x 3: refused, naming --batch-size x ranks",
               "%s", last_lines(bad.text).c_str());
    th::ChildOutput b2 = run(3, args + "-b 2 -o " + part + " -y");
    std::vector<double> la = step_losses(a.text), lb = step_losses(b1.text + "\n" + b2.text);
    double worst = worst_diff(la, lb, 6);
    bool said = b2.text.find("re-sharded the optimizer state of 2 ranks onto 3") != std::string::npos;
    th::report(exited_ok(a) && exited_ok(b1) && exited_ok(b2) && said && worst <= 2e-6,
               "resume 2 ranks -> 3 ranks (--zero 1): state re-sharded, losses of the uninterrupted run",
               "max diff %.2g over %zu steps%s", worst, lb.size(),
               exited_ok(b2) ? "" : (" | " + last_lines(b2.text)).c_str());
}

// --log-ranks on 2 ranks given `args` (a short run): rank 0 writes log.jsonl and rank 1 its own
// log_rank1.jsonl, each with its memory anatomy, rank 1's with its rank and its own loss. Returns the
// run, for what else its output shows.
inline th::ChildOutput check_log_ranks(const std::string& args) {
    std::string dir = tmp + "/log_ranks";
    th::ChildOutput c = run(2, args + " --log-ranks -o " + dir);
    std::string r0 = th::slurp(dir + "/log.jsonl"), r1 = th::slurp(dir + "/log_rank1.jsonl");
    bool ok = th::exited_ok(c) && r0.find("\"memory\":{") != std::string::npos &&
              r1.find("\"memory\":{") != std::string::npos && r1.find("\"rank_loss\":") != std::string::npos &&
              r1.find("\"rank\":1") != std::string::npos;
    th::report(ok, "--log-ranks: rank 1 writes log_rank1.jsonl with its memory anatomy and its own loss", "%s",
               ok ? "" : th::last_lines(c.text + r1).c_str());
    return c;
}

// A run on 2 ranks given `args` that name the missing file `missing`: it must fail, and the message
// that stops the job must say which rank failed and why.
inline void check_failing_rank(const std::string& args, const char* missing) {
    th::ChildOutput bad = run(2, args);
    bool named = bad.text.find("rank 0/2: ") != std::string::npos || bad.text.find("rank 1/2: ") != std::string::npos;
    th::report(!th::exited_ok(bad) && named && bad.text.find(missing) != std::string::npos,
               "a rank that fails stops the job with its rank in the message", "%s", th::last_lines(bad.text).c_str());
}

// Bad options on 2 ranks, `bad_option` found when parsing (e.g. `--bogus`) and `late_option` only once
// the model and data are known: each fails with exit status 2 and the message (`says_parse`,
// `says_late`) printed once, not once per rank.
inline void check_option_errors_once(const std::string& bad_option, const char* says_parse,
                                     const std::string& late_option, const char* says_late) {
    for (int late = 0; late < 2; late++) {
        th::ChildOutput c = run(2, late ? late_option : bad_option);
        const std::string says = late ? says_late : says_parse;
        size_t first = c.text.find(says);
        bool once = first != std::string::npos && c.text.find(says, first + 1) == std::string::npos;
        th::report(!th::exited_ok(c) && once,
                   late ? "2 ranks, an option error found after parsing: said once" : "2 ranks, a bad option: said once",
                   "%s", th::last_lines(c.text).c_str());
    }
}

// The test binary's main: given `program_flag` first it is the trainer (`trainer_main`); otherwise it
// makes a scratch folder, runs `checks` and prints the tally.
inline int main(int argc, char** argv, const char* program_flag, int (*trainer_main)(int, char**),
                void (*checks)()) {
    if (argc > 1 && strcmp(argv[1], program_flag) == 0) {
        argv[1] = argv[0];
        return trainer_main(argc - 1, argv + 1);
    }
    self = argv[0], flag = program_flag;
    const char* base = strrchr(argv[0], '/');
    std::string tmpl = "/tmp/" + std::string(base ? base + 1 : argv[0]) + "_XXXXXX";
    if (!mkdtemp(&tmpl[0])) {
        fprintf(stderr, "%s: mkdtemp failed\n", argv[0]);
        return 1;
    }
    tmp = tmpl;
    checks();
    th::run_command("rm -rf " + tmp);
    return th::finish();
}

}  // namespace ranks
