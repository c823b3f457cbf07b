// llmc/file_io.h — reading a whole file into memory with a one-line reason on failure: the loaders
// of the project's file formats (tokenizers, checkpoints, state files) read files with it and parse
// the bytes in memory, which is also what their fuzz targets drive.
#pragma once
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <sys/stat.h>
#include <vector>

// "" when path is a regular file (or nothing: opening it then says why), else what it is instead:
// a directory, or a pipe, socket or device, whose open or read would block or never end.
inline std::string not_a_regular_file(const std::string& path) {
    struct stat st;
    if (stat(path.c_str(), &st) != 0 || S_ISREG(st.st_mode)) return "";
    return path + (S_ISDIR(st.st_mode) ? " is a directory" : " is not a regular file (a pipe, socket or device)");
}

// Whether paths a and b name the same existing file or directory (device and inode).
inline bool same_file(const std::string& a, const std::string& b) {
    struct stat x, y;
    return stat(a.c_str(), &x) == 0 && stat(b.c_str(), &y) == 0 && x.st_dev == y.st_dev && x.st_ino == y.st_ino;
}

// Reads the file at path into *out; false with "cannot open PATH: reason", "PATH is a directory"
// (or not a regular file) or "reading PATH failed".
inline bool read_whole_file(const std::string& path, std::vector<uint8_t>* out, std::string* err) {
    *err = not_a_regular_file(path);
    if (!err->empty()) return false;
    FILE* f = fopen(path.c_str(), "rb");
    if (!f) {
        *err = "cannot open " + path + ": " + strerror(errno);
        return false;
    }
    out->clear();
    uint8_t buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0) out->insert(out->end(), buf, buf + n);
    bool ok = !ferror(f);
    fclose(f);
    if (!ok) *err = "reading " + path + " failed";
    return ok;
}
