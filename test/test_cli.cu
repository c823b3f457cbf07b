// test/test_cli.cu — the command-line parser (llmc/cli.h): long options and llm.c's short flags
// (one or two letters, switches taking an optional 0/1), --help listing every option with its
// default, and one error line naming the option, exit status 2, for every kind of bad input.
#include "../llmc/cli.h"
#include "harness.h"

#include <sys/wait.h>

// The trainer-like table the tests parse against.
Cli make_cli() {
    Cli cli("prog", "A test program.");
    cli.add("train-data", "i", "GLOB", "data/*.bin", "training shards");
    cli.add("batch-size", "b", "INT", "4", "micro-batch size");
    cli.add("lr", "l", "FLOAT", "3e-4", "learning rate");
    cli.add("keep-checkpoints", "nk", "K", "0", "checkpoints to keep");
    cli.add("label", nullptr, "NAME", "", "a name");
    cli.add_flag("resume", "y", "resume");
    cli.add_flag("shuffle", nullptr, "shuffle");
    return cli;
}

// Parses args (argv[0] added) with the table above.
Cli parse(std::vector<std::string> args) {
    args.insert(args.begin(), "prog");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(&a[0]);
    Cli cli = make_cli();
    cli.parse((int)argv.size(), argv.data());
    return cli;
}

// The parse (and value reads) must stop with status 2 and `expect` in the message.
template <class F>
void expect_error(const char* name, const char* expect, F body) {
    th::ChildOutput child = th::run_in_child(body);
    std::string& err = child.text;
    while (!err.empty() && err.back() == '\n') err.pop_back();
    bool one_line = err.find('\n') == std::string::npos;
    bool ok = WIFEXITED(child.status) && WEXITSTATUS(child.status) == 2 && err.find(expect) != std::string::npos &&
              one_line;
    th::report(ok, name, "exit %d, stderr: %s", WIFEXITED(child.status) ? WEXITSTATUS(child.status) : -1, err.c_str());
}

int main() {
    {
        Cli cli = parse({"--train-data", "x.bin", "-b", "8", "--lr=0.01", "-nk", "3", "-y", "1", "--shuffle"});
        bool ok = cli.str("train-data") == "x.bin" && cli.integer("batch-size") == 8 && cli.number("lr") == 0.01 &&
                  cli.integer("keep-checkpoints") == 3 && cli.flag("resume") && cli.flag("shuffle") &&
                  !cli.given("label") && cli.str("label").empty();
        th::report(ok, "long options, --name=value, one- and two-letter llm.c flags, switches", "");
    }
    {
        Cli off = parse({"-y", "0", "-b", "2"}), bare = parse({"-y", "-b", "2"});
        bool ok = !off.flag("resume") && off.given("resume") && off.integer("batch-size") == 2 && bare.flag("resume") &&
                  bare.integer("batch-size") == 2;
        th::report(ok, "llm.c switch values: -y 0 off, -y 1 on, bare -y on", "");
    }
    {
        Cli defaults = parse({});
        bool ok = defaults.integer("batch-size") == 4 && defaults.number("lr") == 3e-4 && !defaults.flag("resume");
        th::report(ok, "defaults when nothing is given", "");
    }
    {
        th::ChildOutput child = th::run_in_child([] {
            dup2(2, 1);  // --help prints to stdout; the harness captures stderr
            parse({"--help"});
        });
        const std::string& out = child.text;
        bool every = true;
        for (const char* want : {"-i,  --train-data GLOB", "[data/*.bin]", "-b,  --batch-size INT", "[4]", "-nk, --keep-checkpoints K",
                                 "[3e-4]", "--label NAME", "[none]", "-y,  --resume", "--shuffle"})
            every = every && out.find(want) != std::string::npos;
        th::report(WIFEXITED(child.status) && WEXITSTATUS(child.status) == 0 && every,
                   "--help lists every option, its llm.c flag and its default, exit 0", "%zu bytes", out.size());
    }
    expect_error("unknown long option", "unknown option '--batchsize'", [] { parse({"--batchsize", "4"}); });
    expect_error("unknown short flag", "unknown option '-z'", [] { parse({"-z", "1"}); });
    expect_error("stray argument", "unexpected argument 'data.bin'", [] { parse({"data.bin"}); });
    expect_error("missing value", "option --batch-size needs a value (INT)", [] { parse({"-b"}); });
    expect_error("switch given a value", "option --shuffle takes no value", [] { parse({"--shuffle=1"}); });
    expect_error("not an integer", "option --batch-size: '4x' is not an integer",
                 [] { parse({"-b", "4x"}).integer("batch-size", 1, 100); });
    expect_error("integer out of range", "option --batch-size: 0 is out of range [1, 100]",
                 [] { parse({"-b", "0"}).integer("batch-size", 1, 100); });
    expect_error("integer overflow", "is not an integer",
                 [] { parse({"-b", "99999999999999999999"}).integer("batch-size", 1, 100); });
    expect_error("not a number", "option --lr: 'fast' is not a number", [] { parse({"-l", "fast"}).number("lr", 0, 1); });
    expect_error("nan is not a number", "option --lr: 'nan' is not a number", [] { parse({"-l", "nan"}).number("lr", 0, 1); });
    expect_error("number out of range", "option --lr: 5 is out of range [0, 1]", [] { parse({"-l", "5"}).number("lr", 0, 1); });
    expect_error("empty value", "option --batch-size: '' is not an integer",
                 [] { parse({"--batch-size="}).integer("batch-size", 1, 100); });
    return th::finish();
}
