#include "model/parts.hpp"

namespace mtnlg::model {

void Norm::stats(Tensor& mean, Tensor& rstd, int64_t rows, DType wide, Device dev) const {
  mean = rms ? Tensor() : Tensor::empty({rows}, wide, dev);
  rstd = Tensor::empty({rows}, wide, dev);
}

void Norm::forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& w, const Tensor& b) const {
  if (rms)
    ops::rmsnorm_forward(out, rstd, x, w, eps);
  else
    ops::layernorm_forward(out, mean, rstd, x, w, b, eps);
}

void Norm::residual_forward(Tensor& sum, Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& branch,
                            const ops::ResidualBranch& br, const Tensor& w, const Tensor& b) const {
  if (rms)
    ops::residual_rmsnorm_forward(sum, out, rstd, x, branch, br, w, eps);
  else
    ops::residual_layernorm_forward(sum, out, mean, rstd, x, branch, br, w, b, eps);
}

void Norm::backward(Tensor& dx, Tensor& dw, Tensor& db, const Tensor& dout, const Tensor& x, const Tensor& w,
                    const Tensor& mean, const Tensor& rstd) const {
  if (rms)
    ops::rmsnorm_backward(dx, dw, dout, x, w, rstd);
  else
    ops::layernorm_backward(dx, dw, db, dout, x, w, mean, rstd);
}

void Norm::residual_backward(Tensor& dx, Tensor& dw, Tensor& db, const Tensor& dresidual, const Tensor& dout,
                             const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd) const {
  if (rms)
    ops::residual_rmsnorm_backward(dx, dw, dresidual, dout, x, w, rstd);
  else
    ops::residual_layernorm_backward(dx, dw, db, dresidual, dout, x, w, mean, rstd);
}

void Mlp::forward(Tensor& act, Tensor& pre, const Tensor& in, const Tensor& w1, const Tensor* b1) const {
  if (swiglu) {
    ops::matmul_forward(pre, in, w1, b1);
    ops::swiglu_forward(act, pre);
  } else if (b1) {
    ops::matmul_bias_gelu_forward(act, pre, in, w1, *b1);  // one GEMM with its epilogue where offered
  } else {
    ops::matmul_forward(pre, in, w1, nullptr);
    ops::gelu_forward(act, pre);
  }
}

void Mlp::backward(Tensor& dpre, Tensor* db1, const Tensor& dout, const Tensor& w2, const Tensor& pre) const {
  if (!swiglu && db1) {
    ops::matmul_dgelu_backward(dpre, *db1, dout, w2, pre);
    return;
  }
  Tensor dact = Tensor::empty({dout.dim(0), w2.dim(1)}, dout.dtype(), dout.device());
  // fc2's input gradient only (its weight gradient is the caller's): `inp` is read for its
  // shape alone, so dact stands in for it.
  ops::matmul_backward(&dact, nullptr, nullptr, dout, dact, w2);
  if (swiglu)
    ops::swiglu_backward(dpre, dact, pre);
  else
    ops::gelu_backward(dpre, pre, dact);
  if (db1) ops::bias_add_backward(*db1, dpre);
}

void QkNorm::forward(Tensor& qkv, Tensor& pre, Tensor& rstd, const Tensor& wq, const Tensor& wk, int64_t heads,
                     int64_t groups, bool keep, DType wide) const {
  if (!on) return;
  const int64_t g = groups ? groups : heads;
  rstd = Tensor::empty({qkv.dim(0) * qkv.dim(1) * g * (heads / g + 1)}, wide, qkv.device());
  if (keep) {
    pre = qkv;
    qkv = Tensor::empty(pre.shape(), pre.dtype(), pre.device());
  }
  ops::qk_norm_forward(qkv, rstd, keep ? pre : qkv, wq, wk, heads, groups, eps);
  if (!keep) rstd = Tensor();
}

void QkNorm::backward(Tensor& dqkv, Tensor& dwq, Tensor& dwk, const Tensor& pre, const Tensor& rstd, const Tensor& wq,
                      const Tensor& wk, int64_t heads, int64_t groups) const {
  if (on) ops::qk_norm_backward(dqkv, dwq, dwk, dqkv, pre, wq, wk, rstd, heads, groups);
}

void Rotary::forward(Tensor& qkv, int64_t heads, int64_t groups, int64_t past) const {
  if (on) ops::rope_forward(qkv, qkv, heads, groups, params, past);
}

void Rotary::backward(Tensor& dqkv, int64_t heads, int64_t groups, int64_t past) const {
  if (on) ops::rope_backward(dqkv, dqkv, heads, groups, params, past);
}

}  // namespace mtnlg::model
