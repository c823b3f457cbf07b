// test/sass/attention_kernels.cu — the translation unit scripts/sass_check.py compiles to read the
// SASS of the bf16 FlashAttention-2 kernels at head size 64 (llmc/attention.cuh), with dropout off and
// on (and the backward summing dQ's slices itself), and of the wgmma kernels (sm_90a: the forward, the backward with dQ added at once and deferred,
// and adding it at once with registers for 3 blocks per SM and by reductions in L2, each and both, and
// summing dQ's slices in the kernel, with 2 blocks per SM and with 3 and reductions); it also asserts,
// at compile time, that two blocks of each fit one SM's shared memory on the smallest architecture the
// check covers (A100, sm_80), four of the wgmma forward an H100's and three of the wgmma backward adding
// dQ at once.
#include "../../llmc/attention.cuh"

using Bf16Tile = AttnMmaTile<__nv_bfloat16, 64>;

// Shared memory per SM on sm_80 (A100): 164 KiB, of which each resident block also takes 1 KiB
// the system reserves (CUDA programming guide, compute capabilities table).
constexpr size_t kSm80SharedPerSm = 164 * 1024, kReservedPerBlock = 1024;
static_assert(2 * (Bf16Tile::kForwardSmem + kReservedPerBlock) <= kSm80SharedPerSm,
              "the bf16 head-size-64 forward no longer fits two blocks per SM on an A100");
static_assert(2 * (Bf16Tile::kBackwardSmem + kReservedPerBlock) <= kSm80SharedPerSm,
              "the bf16 head-size-64 backward no longer fits two blocks per SM on an A100");
// The wgmma kernels on an H100 (228 KiB per SM).
static_assert(4 * (AttnWgmmaFwdTile::kSmem + kReservedPerBlock) <= 228 * 1024,
              "the wgmma forward no longer fits four blocks per SM on an H100");
static_assert(2 * (AttnWgmmaTile<false>::kSmem + kReservedPerBlock) <= 228 * 1024 &&
                  2 * (AttnWgmmaTile<true>::kSmem + kReservedPerBlock) <= 228 * 1024,
              "the wgmma backward no longer fits two blocks per SM on an H100");
static_assert(3 * (AttnWgmmaTile<false>::kSmem + kReservedPerBlock) <= 228 * 1024,
              "the wgmma backward adding dQ at once no longer fits three blocks per SM on an H100");

// Taking each kernel's address instantiates it (nothing here runs): the forward with production's row
// tiles per warp.
void* sass_check_kernels[] = {
    (void*)&attention_forward_mma_kernel<__nv_bfloat16, 64, false, Bf16Tile::kFwdTiles>,
    (void*)&attention_forward_mma_kernel<__nv_bfloat16, 64, true, Bf16Tile::kFwdTiles>,
    (void*)&attention_backward_mma_kernel<__nv_bfloat16, 64, false>,
    (void*)&attention_backward_mma_kernel<__nv_bfloat16, 64, true>,
    (void*)&attention_backward_mma_kernel<__nv_bfloat16, 64, false, false, true>,
    (void*)&attention_backward_wgmma_kernel<__nv_bfloat16, false>,
    (void*)&attention_backward_wgmma_kernel<__nv_bfloat16, true>,
    (void*)&attention_backward_wgmma_kernel<__nv_bfloat16, false, 3>,
    (void*)&attention_backward_wgmma_kernel<__nv_bfloat16, false, 2, true>,
    (void*)&attention_backward_wgmma_kernel<__nv_bfloat16, false, 3, true>,
    (void*)&attention_backward_wgmma_kernel<__nv_bfloat16, false, 2, false, true>,
    (void*)&attention_backward_wgmma_kernel<__nv_bfloat16, false, 3, true, true>,
    (void*)&attention_forward_wgmma_kernel<__nv_bfloat16>,
};
