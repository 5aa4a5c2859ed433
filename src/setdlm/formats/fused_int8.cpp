// One int8 Llama decoder layer as a single op (docs/quantization.md, "The fused int8 layer").
//
// The same ATen calls, in the same order and on tensors of the same shapes and strides, as the Python layer
// (setdlm.formats.hf.HFBackbone._llama_layer with fused projections, int8 weights, float64 attention and a
// contiguous KV cache), so the outputs and the cache are the same bits; what goes is the Python between the
// calls: argument parsing, module calls, attribute lookups and about 200 dispatcher calls a layer that were
// views, slices and casts. The int8 products call the packed weights' own method (the body of
// quantized::linear_with_input_q_dq_qweight_dq_output_fp32) without the dispatcher.
#include <ATen/ATen.h>
#include <ATen/native/quantized/PackedParams.h>
#include <torch/library.h>

#include <cmath>
#include <limits>

using at::Tensor;
using Packed = c10::intrusive_ptr<LinearPackedParamsBase>;

namespace {

// setdlm.formats.quantize.Int8Linear: each row divided by its absolute maximum, quantized with the range fixed
// at [-1, 1] (scale 2/127, zero point 64), fbgemm's int8 GEMM, multiplied back by the row's maximum.
// x: (..., in) float32 -> (..., out)
Tensor int8_linear(const Tensor& x, const Packed& w, int64_t out_features) {
  auto shape = x.sizes().vec();
  Tensor x2 = x.reshape({-1, shape.back()});                                       // (N, in)
  Tensor m = x2.abs().amax({1}, true).clamp_(std::numeric_limits<float>::min());  // (N, 1)
  Tensor y = w->apply_with_input_q_dq_qweight_dq_output_fp32(x2 / m, 2.0 / 127.0, 64) * m;  // (N, out)
  shape.back() = out_features;
  return y.view(shape);
}

// x * cos + cat(-x2, x1) * sin (setdlm.model.apply_rope)
Tensor apply_rope(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  auto halves = x.chunk(2, -1);
  return x * cos + at::cat({-halves[1], halves[0]}, -1) * sin;
}

// x: (B, T, d) float32; cos, sin: (B, 1, T, hd) float32; ck, cv: (B, Hkv, capacity, hd) float64 contiguous;
// flat: (B*Hkv*T,) rows of the new keys/values in a cache layer viewed as (B*Hkv*capacity, hd);
// mask: (B, 1|H, T, width) float64 additive or None -> (B, T, d)
Tensor llama_int8_layer(const Tensor& x, const Tensor& w_in, const Tensor& w_post, double eps,
                        const Packed& qkv_proj, const Packed& o_proj, const Packed& gate_up_proj,
                        const Packed& down_proj, c10::IntArrayRef sizes, const Tensor& cos, const Tensor& sin,
                        const Tensor& ck, const Tensor& cv, const Tensor& flat, int64_t width,
                        const std::optional<Tensor>& mask, double scale) {
  // sizes: nq, nk, nv (the fused projection's parts), head_dim, d, 2 * intermediate
  const int64_t nq = sizes[0], nk = sizes[1], nv = sizes[2], hd = sizes[3], d = sizes[4], ff2 = sizes[5];
  const int64_t B = x.size(0), T = x.size(1), H = nq / hd, Hkv = nk / hd;
  Tensor h = at::rms_norm(x, {d}, w_in, eps);
  Tensor qkv = int8_linear(h, qkv_proj, nq + nk + nv);                              // (B, T, nq + nk + nv)
  Tensor qk = qkv.slice(-1, 0, nq + nk).view({B, T, -1, hd});                        // (B, T, H + Hkv, hd)
  qk = apply_rope(qk, cos.transpose(1, 2), sin.transpose(1, 2)).transpose(1, 2);  // (B, H + Hkv, T, hd)
  Tensor q = qk.slice(1, 0, H), k = qk.slice(1, H);                               // (B, H|Hkv, T, hd)
  Tensor v = qkv.slice(-1, nq + nk).view({B, T, -1, hd}).transpose(1, 2);           // (B, Hkv, T, hd)
  // float64 attention (setdlm.formats.hf.HFBackbone._attend), the cache written at each row's offset
  q = q.to(at::kDouble), k = k.to(at::kDouble), v = v.to(at::kDouble);
  ck.view({-1, hd}).index_copy_(0, flat, k.to(ck.scalar_type()).reshape({B * Hkv * T, hd}));
  cv.view({-1, hd}).index_copy_(0, flat, v.to(cv.scalar_type()).reshape({B * Hkv * T, hd}));
  Tensor keys = ck.slice(2, 0, width).to(k.scalar_type()), values = cv.slice(2, 0, width).to(v.scalar_type());
  Tensor y = at::scaled_dot_product_attention(q, keys, values, mask, 0.0, false, scale, H > Hkv);
  y = y.to(x.scalar_type()).transpose(1, 2).reshape({B, T, H * hd});  // (B, T, H*hd)
  Tensor out = x + int8_linear(y, o_proj, d);
  h = at::rms_norm(out, {d}, w_post, eps);
  auto gate_up = int8_linear(h, gate_up_proj, ff2).chunk(2, -1);
  return out + int8_linear(at::silu(gate_up[0]) * gate_up[1], down_proj, d);
}

}  // namespace

TORCH_LIBRARY(setdlm_fused, m) {
  m.def(
      "llama_int8_layer(Tensor x, Tensor w_in, Tensor w_post, float eps, "
      "__torch__.torch.classes.quantized.LinearPackedParamsBase qkv_proj, "
      "__torch__.torch.classes.quantized.LinearPackedParamsBase o_proj, "
      "__torch__.torch.classes.quantized.LinearPackedParamsBase gate_up_proj, "
      "__torch__.torch.classes.quantized.LinearPackedParamsBase down_proj, int[] sizes, Tensor cos, Tensor sin, "
      "Tensor(a!) ck, Tensor(b!) cv, Tensor flat, int width, Tensor? mask, float scale) -> Tensor",
      &llama_int8_layer);
}
