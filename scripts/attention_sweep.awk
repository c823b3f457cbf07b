# scripts/attention_sweep.awk — turns dev/cuda/attention.cu's sweep lines into one JSON object each
# (scripts/gpu_check.sh puts them in its JSON and table). A sweep line:
#   "  sweep bf16 HS=64 causal T=1024 B=16 NH=32: fwd F bwd B fwd+bwd FB TFLOP/s  (FlashAttention-2, H100 SXM: A)"
# the part in parentheses only where the FlashAttention-2 paper gives a figure (causal shapes).
$1 == "sweep" && $14 == "TFLOP/s" {
    split($3, hs, "="); split($5, t, "="); split($6, b, "="); split($7, nh, "=")
    sub(/:$/, "", nh[2])
    anchor = "null"
    if (NF >= 18) { anchor = $NF; sub(/\)$/, "", anchor) }
    printf "{\"dtype\":\"%s\",\"head_size\":%s,\"causal\":%s,\"T\":%s,\"B\":%s,\"NH\":%s,", $2, hs[2],
           $4 == "causal" ? "true" : "false", t[2], b[2], nh[2]
    printf "\"fwd_tflops\":%s,\"bwd_tflops\":%s,\"fwd_bwd_tflops\":%s,\"fa2_h100_fwd_bwd_tflops\":%s}\n", $9, $11, $13,
           anchor
}
