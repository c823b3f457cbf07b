// llmc/rng.h — a portable random generator for the trainers' host-side initialization: splitmix64
// uniforms and Box-Muller normals, the same numbers on every platform and compiler (unlike
// std::normal_distribution), so a seed gives the same initial weights everywhere.
#pragma once
#include <cmath>
#include <cstdint>

struct NormalRNG {
    uint64_t state;
    explicit NormalRNG(uint64_t seed) : state(seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull) {}
    uint64_t next() {  // splitmix64
        uint64_t z = (state += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    double uniform() { return ((next() >> 11) + 0.5) * (1.0 / 9007199254740992.0); }  // (0,1)
    float normal(float std) {
        return (float)(std * std::sqrt(-2.0 * std::log(uniform())) * std::cos(2 * M_PI * uniform()));
    }
};
