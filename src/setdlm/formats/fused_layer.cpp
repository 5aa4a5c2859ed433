// One int8 or int4 Llama decoder layer as a single op (docs/quantization.md, "The fused layer").
//
// The same ATen calls, in the same order and on tensors of the same shapes and strides, as the Python layer
// (setdlm.formats.hf.LlamaRunner.layer with fused projections, int8 or int4 weights, float64 attention and a
// contiguous KV cache), so the outputs and the cache are the same bits; what goes is the Python between the
// calls: argument parsing, module calls, attribute lookups and about 200 dispatcher calls a layer that were
// views, slices and casts. The int8 products call the packed weights' own method (the body of
// quantized::linear_with_input_q_dq_qweight_dq_output_fp32) without the dispatcher; the int4 products ATen's
// weight-only int4 kernel on bfloat16 rows, as setdlm.formats.quantize.Int4Linear does.
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

struct Int8 {  // one int8 product: the packed weights
  Packed w;
  Tensor operator()(const Tensor& x, int64_t out_features) const { return int8_linear(x, w, out_features); }
};

// setdlm.formats.quantize.Int4Linear on its bfloat16 path: the row rounded to bfloat16, the int4 kernel (groups
// of 32 input channels; output channels padded to a multiple of 16), the padding dropped, back to float32.
// x: (..., in) float32 -> (..., out)
struct Int4 {
  Tensor q, sz;  // (Np, in / 2) packed codes, (in / 32, Np, 2) bfloat16 scales and offsets
  Tensor operator()(const Tensor& x, int64_t out_features) const {
    auto shape = x.sizes().vec();
    Tensor x2 = x.reshape({-1, shape.back()});                                              // (N, in)
    Tensor y = at::_weight_int4pack_mm_for_cpu(x2.to(at::kBFloat16), q, 32, sz);            // (N, Np)
    y = y.slice(1, 0, out_features).to(at::kFloat);                                         // (N, out)
    shape.back() = out_features;
    return y.view(shape);
  }
};

// x * cos + cat(-x2, x1) * sin (setdlm.model.apply_rope)
Tensor apply_rope(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  auto halves = x.chunk(2, -1);
  return x * cos + at::cat({-halves[1], halves[0]}, -1) * sin;
}

// x: (B, T, d) float32; cos, sin: (B, 1, T, hd) float32; ck, cv: (B, Hkv, capacity, hd) float64 contiguous;
// flat: (B*Hkv*T,) rows of the new keys/values in a cache layer viewed as (B*Hkv*capacity, hd);
// mask: (B, 1|H, T, width) float64 additive or None -> (B, T, d)
template <typename Linear>
Tensor llama_layer(const Tensor& x, const Tensor& w_in, const Tensor& w_post, double eps, const Linear& qkv_proj,
                   const Linear& o_proj, const Linear& gate_up_proj, const Linear& down_proj, c10::IntArrayRef sizes,
                   const Tensor& cos, const Tensor& sin, const Tensor& ck, const Tensor& cv, const Tensor& flat,
                   int64_t width, const std::optional<Tensor>& mask, double scale) {
  // sizes: nq, nk, nv (the fused projection's parts), head_dim, d, 2 * intermediate
  const int64_t nq = sizes[0], nk = sizes[1], nv = sizes[2], hd = sizes[3], d = sizes[4], ff2 = sizes[5];
  const int64_t B = x.size(0), T = x.size(1), H = nq / hd, Hkv = nk / hd;
  Tensor h = at::rms_norm(x, {d}, w_in, eps);
  Tensor qkv = qkv_proj(h, nq + nk + nv);                              // (B, T, nq + nk + nv)
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
  Tensor out = x + o_proj(y, d);
  h = at::rms_norm(out, {d}, w_post, eps);
  auto gate_up = gate_up_proj(h, ff2).chunk(2, -1);
  return out + down_proj(at::silu(gate_up[0]) * gate_up[1], d);
}

Tensor llama_int8_layer(const Tensor& x, const Tensor& w_in, const Tensor& w_post, double eps,
                        const Packed& qkv_proj, const Packed& o_proj, const Packed& gate_up_proj,
                        const Packed& down_proj, c10::IntArrayRef sizes, const Tensor& cos, const Tensor& sin,
                        const Tensor& ck, const Tensor& cv, const Tensor& flat, int64_t width,
                        const std::optional<Tensor>& mask, double scale) {
  return llama_layer(x, w_in, w_post, eps, Int8{qkv_proj}, Int8{o_proj}, Int8{gate_up_proj}, Int8{down_proj}, sizes,
                     cos, sin, ck, cv, flat, width, mask, scale);
}

// products: the packed codes and the scales/offsets of qkv_proj, o_proj, gate_up_proj and down_proj, in turn
Tensor llama_int4_layer(const Tensor& x, const Tensor& w_in, const Tensor& w_post, double eps,
                        at::TensorList products, c10::IntArrayRef sizes, const Tensor& cos, const Tensor& sin,
                        const Tensor& ck, const Tensor& cv, const Tensor& flat, int64_t width,
                        const std::optional<Tensor>& mask, double scale) {
  TORCH_CHECK(products.size() == 8, "llama_int4_layer: 8 product tensors expected, got ", products.size());
  return llama_layer(x, w_in, w_post, eps, Int4{products[0], products[1]}, Int4{products[2], products[3]},
                     Int4{products[4], products[5]}, Int4{products[6], products[7]}, sizes, cos, sin, ck, cv, flat,
                     width, mask, scale);
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
  m.def(
      "llama_int4_layer(Tensor x, Tensor w_in, Tensor w_post, float eps, Tensor[] products, int[] sizes, "
      "Tensor cos, Tensor sin, Tensor(a!) ck, Tensor(b!) cv, Tensor flat, int width, Tensor? mask, float scale) "
      "-> Tensor",
      &llama_int4_layer);
}
