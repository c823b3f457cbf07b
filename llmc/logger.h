// llmc/logger.h — the machine-readable run log shared by the trainers: one JSON object per line
// (JSON Lines), flushed as it is written, so scripts/plot.py can chart a run while it trains.
//
// Every line has "event" and "step" first, in that order, e.g.
//   {"event":"step","step":12,"loss":5.91,...}   {"event":"val","step":25,"loss":6.02}
// "step" counts completed optimizer steps. A resumed run (resume_step >= 0) keeps what the log
// holds up to its checkpoint and drops the rest, which the resumed run writes again: lines after
// the checkpoint's step, and the validation at that step (evaluated again before the next step).
// A fresh run that finds a log (an earlier run stopped before its first checkpoint, which a fresh
// run is allowed to start over) keeps it under the first free name PATH.1, PATH.2, ... and says so.
#pragma once
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "json.h"

// A number as JSON: non-finite values (a diverged loss) become null, which JSON can hold.
inline std::string json_number(double x, const char* fmt = "%.9g") {
    if (x != x || x == 1.0 / 0.0 || x == -1.0 / 0.0) return "null";
    char buf[64];
    snprintf(buf, sizeof(buf), fmt, x);
    return buf;
}

// The fields of a log line after "event" and "step", built in the order they are added: e.g.
// JsonFields().number("loss", 5.91).integer("rows", 12) is ,"loss":5.91,"rows":12
class JsonFields {
  public:
    JsonFields& number(const char* key, double x, const char* fmt = "%.9g") { return raw(key, json_number(x, fmt)); }
    JsonFields& integer(const char* key, long long n) { return raw(key, std::to_string(n)); }
    JsonFields& text(const char* key, const std::string& s) { return raw(key, json::quote(s)); }
    JsonFields& boolean(const char* key, bool b) { return raw(key, b ? "true" : "false"); }
    // A value that is JSON already (an object, an array).
    JsonFields& raw(const char* key, const std::string& json) {
        s_ += std::string(",\"") + key + "\":" + json;
        return *this;
    }
    // Appends another builder's fields.
    JsonFields& append(const JsonFields& more) {
        s_ += more.s_;
        return *this;
    }
    const std::string& str() const { return s_; }

  private:
    std::string s_;
};

class RunLog {
  public:
    ~RunLog() {
        if (f_) fclose(f_);
    }
    // Opens path for writing: fresh (resume_step < 0) or continuing a resumed run (see above).
    bool open(const std::string& path, long long resume_step, std::string* err) {
        std::vector<std::string> kept;
        if (resume_step >= 0) {
            std::ifstream in(path);
            std::string line;
            while (std::getline(in, line)) {
                char event[32];
                long long step;
                if (sscanf(line.c_str(), "{\"event\":\"%31[a-z_]\",\"step\":%lld", event, &step) != 2) continue;
                if (step < resume_step || (step == resume_step && strcmp(event, "val") != 0)) kept.push_back(line);
            }
        }
        std::ifstream old(path);
        if (resume_step < 0 && old && old.peek() != std::ifstream::traits_type::eof()) {
            old.close();
            std::string aside;
            for (int n = 1; aside.empty() || std::ifstream(aside); n++) aside = path + "." + std::to_string(n);
            if (rename(path.c_str(), aside.c_str()) != 0) {
                *err = "cannot keep the earlier log " + path + " as " + aside + ": " + strerror(errno);
                return false;
            }
            printf("log: %s held an earlier run's log (no checkpoint to resume from): kept as %s\n", path.c_str(),
                   aside.c_str());
        }
        f_ = fopen(path.c_str(), "w");
        if (!f_) {
            *err = "cannot write the log " + path + ": " + strerror(errno);
            return false;
        }
        for (const std::string& line : kept) fprintf(f_, "%s\n", line.c_str());
        fflush(f_);
        return true;
    }
    bool is_open() const { return f_ != nullptr; }

    // Appends one line: {"event":EVENT,"step":STEP, then the fields, then }.
    void write(const char* event, long long step, const JsonFields& fields = JsonFields()) {
        if (!f_) return;
        fprintf(f_, "{\"event\":\"%s\",\"step\":%lld%s}\n", event, step, fields.str().c_str());
        fflush(f_);
    }

  private:
    FILE* f_ = nullptr;
};
