// Feature maps other than luna (luna_feature_map.cpp), the activations, and the
// dispatch. Hand-written: the point of a reference is plain loops one can check
// against docs/MATH.md line by line, in double.
#include "reference/feature_map.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>
#include <numbers>

namespace lunajit::reference {
namespace {

double sigmoid(double t) { return 1.0 / (1.0 + std::exp(-t)); }

double softplus(double t) { return t > 0 ? t + std::log1p(std::exp(-t)) : std::log1p(std::exp(t)); }

double gelu(double t) { return 0.5 * t * (1.0 + std::erf(t / std::numbers::sqrt2)); }

double gelu_grad(double t) {
  const double inv_sqrt_2pi = 0.5 * std::numbers::inv_sqrtpi * std::numbers::sqrt2;
  return 0.5 * (1.0 + std::erf(t / std::numbers::sqrt2)) + t * inv_sqrt_2pi * std::exp(-0.5 * t * t);
}

double dot(const double* a, const double* b, int n) {
  double s = 0;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// y = W x + b for W [rows, d]: the affine map of t2r and hedgehog.
void affine(const double* W, const double* b, const double* x, int rows, int d, double* y) {
  for (int r = 0; r < rows; ++r) y[r] = dot(W + int64_t(r) * d, x, d) + b[r];
}

// Given dy, accumulates dW += dy x^T, db += dy (when learned) and dx += W^T dy.
void affine_backward(const double* W, const double* x, const double* dy, int rows, int d,
                     double* dx, double* dW, double* db) {
  for (int r = 0; r < rows; ++r) {
    const double* w = W + int64_t(r) * d;
    for (int c = 0; c < d; ++c) dx[c] += dy[r] * w[c];
    if (dW) {
      for (int c = 0; c < d; ++c) dW[int64_t(r) * d + c] += dy[r] * x[c];
    }
    if (db) db[r] += dy[r];
  }
}

// softmax of y [n] (max-shifted) into p [n].
void softmax(const double* y, int n, double sign, double* p) {
  double mx = -std::numeric_limits<double>::infinity();
  for (int i = 0; i < n; ++i) mx = std::max(mx, sign * y[i]);
  double s = 0;
  for (int i = 0; i < n; ++i) s += (p[i] = std::exp(sign * y[i] - mx));
  for (int i = 0; i < n; ++i) p[i] /= s;
}

}  // namespace

double activation(Activation a, double t) {
  switch (a) {
    case Activation::relu: return t > 0 ? t : 0.0;
    case Activation::gelu: return gelu(t);
    case Activation::silu: return t * sigmoid(t);
    case Activation::tanh: return std::tanh(t);
  }
  return 0;
}

double activation_grad(Activation a, double t) {
  switch (a) {
    case Activation::relu: return t > 0 ? 1.0 : 0.0;
    case Activation::gelu: return gelu_grad(t);
    case Activation::silu: {
      const double s = sigmoid(t);
      return s + t * s * (1 - s);
    }
    case Activation::tanh: {
      const double th = std::tanh(t);
      return 1 - th * th;
    }
  }
  return 0;
}

double output_activation(OutputActivation a, double y) {
  switch (a) {
    case OutputActivation::relu: return y > 0 ? y : 0.0;
    case OutputActivation::softplus: return softplus(y);
    case OutputActivation::none: return y;
  }
  return 0;
}

double output_activation_grad(OutputActivation a, double y) {
  switch (a) {
    case OutputActivation::relu: return y > 0 ? 1.0 : 0.0;
    case OutputActivation::softplus: return sigmoid(y);
    case OutputActivation::none: return 1.0;
  }
  return 0;
}

double bank_basis(int l, double u) {
  switch (l % 8) {
    case 0: return std::sin(u);
    case 1: return std::cos(u);
    case 2: return std::tanh(u);
    case 3: return sigmoid(u);
    case 4: return u > 0 ? u : 0.0;
    case 5: return gelu(u);
    case 6: return softplus(u);
    default: return std::exp(-0.5 * u * u);
  }
}

double bank_basis_grad(int l, double u) {
  switch (l % 8) {
    case 0: return std::cos(u);
    case 1: return -std::sin(u);
    case 2: {
      const double th = std::tanh(u);
      return 1 - th * th;
    }
    case 3: {
      const double s = sigmoid(u);
      return s * (1 - s);
    }
    case 4: return u > 0 ? 1.0 : 0.0;
    case 5: return gelu_grad(u);
    case 6: return sigmoid(u);
    default: return -u * std::exp(-0.5 * u * u);
  }
}

FeatureMap::FeatureMap(const AttentionSpec& spec, std::span<const double> head_params)
    : spec_(spec), layout_(param_layout(spec)), p_(head_params), dim_(spec.feature_dim()) {
  assert(int64_t(p_.size()) >= layout_.per_head_floats);
}

int64_t FeatureMap::offset(const char* name) const {
  const ParamTensor* t = layout_.find(name);
  return t ? t->offset : -1;
}

bool FeatureMap::learned(const char* name) const {
  const ParamTensor* t = layout_.find(name);
  return t && t->learned;
}

void FeatureMap::performer_exponents(const double* x, double* e) const {
  const int d = spec_.head_dim, m = spec_.performer.features;
  const double scale = std::pow(double(d), -0.25);
  const double* omega = p_.data() + offset("omega");
  double sq = 0;
  for (int c = 0; c < d; ++c) sq += (scale * x[c]) * (scale * x[c]);
  for (int r = 0; r < m; ++r) e[r] = scale * dot(omega + int64_t(r) * d, x, d) - 0.5 * sq;
}

std::vector<double> FeatureMap::stabilizers(const double* x, int n, Role role) const {
  std::vector<double> stab(n, 0.0);
  if (spec_.family != Family::performer || n == 0) return stab;
  const int d = spec_.head_dim;
  std::vector<double> e(spec_.performer.features);
  for (int t = 0; t < n; ++t) {
    performer_exponents(x + int64_t(t) * d, e.data());
    stab[t] = *std::max_element(e.begin(), e.end());
  }
  if (role == Role::key) std::fill(stab.begin(), stab.end(), *std::max_element(stab.begin(), stab.end()));
  return stab;
}

void FeatureMap::forward(const double* x, int n, const RowContext& ctx, double* phi) const {
  const int d = spec_.head_dim, D = dim_;
  std::vector<double> tmp(std::max(D, 1));
  for (int t = 0; t < n; ++t) {
    const double* xr = x + int64_t(t) * d;
    double* f = phi + int64_t(t) * D;
    switch (spec_.family) {
      case Family::luna: luna_forward(xr, 1, f); break;
      case Family::performer: {
        const int m = spec_.performer.features;
        performer_exponents(xr, tmp.data());
        const double s = ctx.stab ? ctx.stab[t] : 0.0;
        for (int r = 0; r < m; ++r)
          f[r] = std::exp(tmp[r] - s) / std::sqrt(double(m)) + spec_.performer.kernel_eps;
        break;
      }
      case Family::rff: {
        const int m = spec_.rff.features;
        const double* omega = p_.data() + offset("omega");
        for (int r = 0; r < m; ++r) {
          const double w = dot(omega + int64_t(r) * d, xr, d);
          f[r] = std::cos(w) / std::sqrt(double(m));
          f[m + r] = std::sin(w) / std::sqrt(double(m));
        }
        break;
      }
      case Family::elu:
        for (int c = 0; c < d; ++c) f[c] = xr[c] > 0 ? xr[c] + 1 : std::exp(xr[c]);
        break;
      case Family::relu:
        for (int c = 0; c < d; ++c) f[c] = std::max(xr[c], 0.0);
        break;
      case Family::t2r:
        affine(p_.data() + offset("W"), p_.data() + offset("b"), xr, D, d, f);
        for (int r = 0; r < D; ++r) f[r] = std::max(f[r], 0.0);
        break;
      case Family::hedgehog: {
        const int nf = D / 2;
        affine(p_.data() + offset("W"), p_.data() + offset("b"), xr, nf, d, tmp.data());
        softmax(tmp.data(), nf, 1.0, f);
        softmax(tmp.data(), nf, -1.0, f + nf);
        break;
      }
      case Family::cosformer: {
        const double angle = std::numbers::pi * (ctx.first_position + t) / (2.0 * ctx.seq_len);
        for (int c = 0; c < d; ++c) {
          const double r = std::max(xr[c], 0.0);
          f[c] = r * std::sin(angle);
          f[d + c] = r * std::cos(angle);
        }
        break;
      }
      case Family::slay: {
        const int R = spec_.slay.nodes, P = spec_.slay.anchors, M = spec_.slay.prf_features;
        const double* anchors = p_.data() + offset("anchors");
        const double* omega = p_.data() + offset("omega");
        const double* nodes = p_.data() + offset("nodes");
        const double* weights = p_.data() + offset("weights");
        const double norm = std::sqrt(dot(xr, xr, d));
        std::vector<double> u(d), anc(P);
        for (int c = 0; c < d; ++c) u[c] = xr[c] / norm;
        for (int p = 0; p < P; ++p) {
          const double a = dot(anchors + int64_t(p) * d, u.data(), d);
          anc[p] = a * a / std::sqrt(double(P));
        }
        for (int r = 0; r < R; ++r) {
          const double s = nodes[r], sw = std::sqrt(weights[r]);
          for (int j = 0; j < M; ++j) {
            const double* w = omega + (int64_t(r) * M + j) * d;
            const double prf = std::exp(std::sqrt(2 * s) * dot(w, u.data(), d) - s) / std::sqrt(double(M));
            for (int p = 0; p < P; ++p) f[(int64_t(r) * P + p) * M + j] = sw * anc[p] * prf;
          }
        }
        break;
      }
    }
  }
}

void FeatureMap::backward(const double* x, int n, const RowContext& ctx, const double* dphi,
                          double* dx, double* dparams) const {
  if (spec_.family == Family::luna) {
    luna_backward(x, n, dphi, dx, dparams);
    return;
  }
  const int d = spec_.head_dim, D = dim_;
  std::vector<double> tmp(std::max(D, 1)), dy(std::max(D, 1));
  for (int t = 0; t < n; ++t) {
    const double* xr = x + int64_t(t) * d;
    const double* g = dphi + int64_t(t) * D;
    double* gx = dx + int64_t(t) * d;
    switch (spec_.family) {
      case Family::luna: break;
      case Family::performer: {
        // d/dx' of exp(omega_r . x' - |x'|^2/2 - stab) = (phi_r - kernel_eps) (omega_r - x').
        const int m = spec_.performer.features;
        const double scale = std::pow(double(d), -0.25);
        const double* omega = p_.data() + offset("omega");
        performer_exponents(xr, tmp.data());
        const double s = ctx.stab ? ctx.stab[t] : 0.0;
        for (int r = 0; r < m; ++r) {
          const double c = g[r] * std::exp(tmp[r] - s) / std::sqrt(double(m));
          const double* w = omega + int64_t(r) * d;
          for (int k = 0; k < d; ++k) gx[k] += c * scale * (w[k] - scale * xr[k]);
        }
        break;
      }
      case Family::rff: {
        const int m = spec_.rff.features;
        const double* omega = p_.data() + offset("omega");
        for (int r = 0; r < m; ++r) {
          const double* w = omega + int64_t(r) * d;
          const double a = dot(w, xr, d);
          const double c = (-g[r] * std::sin(a) + g[m + r] * std::cos(a)) / std::sqrt(double(m));
          for (int k = 0; k < d; ++k) gx[k] += c * w[k];
        }
        break;
      }
      case Family::elu:
        for (int c = 0; c < d; ++c) gx[c] += g[c] * (xr[c] > 0 ? 1.0 : std::exp(xr[c]));
        break;
      case Family::relu:
        for (int c = 0; c < d; ++c) gx[c] += xr[c] > 0 ? g[c] : 0.0;
        break;
      case Family::t2r: {
        const double* W = p_.data() + offset("W");
        affine(W, p_.data() + offset("b"), xr, D, d, tmp.data());
        for (int r = 0; r < D; ++r) dy[r] = tmp[r] > 0 ? g[r] : 0.0;
        affine_backward(W, xr, dy.data(), D, d, gx, learned("W") ? dparams + offset("W") : nullptr,
                        learned("b") ? dparams + offset("b") : nullptr);
        break;
      }
      case Family::hedgehog: {
        // softmax Jacobian: dy = p (g_p - p.g_p) for the + half, minus the same for the - half.
        const int nf = D / 2;
        const double* W = p_.data() + offset("W");
        std::vector<double> pp(nf), pm(nf);
        affine(W, p_.data() + offset("b"), xr, nf, d, tmp.data());
        softmax(tmp.data(), nf, 1.0, pp.data());
        softmax(tmp.data(), nf, -1.0, pm.data());
        const double sp = dot(pp.data(), g, nf), sm = dot(pm.data(), g + nf, nf);
        for (int r = 0; r < nf; ++r) dy[r] = pp[r] * (g[r] - sp) - pm[r] * (g[nf + r] - sm);
        affine_backward(W, xr, dy.data(), nf, d, gx, learned("W") ? dparams + offset("W") : nullptr,
                        learned("b") ? dparams + offset("b") : nullptr);
        break;
      }
      case Family::cosformer: {
        const double angle = std::numbers::pi * (ctx.first_position + t) / (2.0 * ctx.seq_len);
        for (int c = 0; c < d; ++c)
          if (xr[c] > 0) gx[c] += g[c] * std::sin(angle) + g[d + c] * std::cos(angle);
        break;
      }
      case Family::slay: {
        const int R = spec_.slay.nodes, P = spec_.slay.anchors, M = spec_.slay.prf_features;
        const double* anchors = p_.data() + offset("anchors");
        const double* omega = p_.data() + offset("omega");
        const double* nodes = p_.data() + offset("nodes");
        const double* weights = p_.data() + offset("weights");
        const double norm = std::sqrt(dot(xr, xr, d));
        std::vector<double> u(d), adot(P), anc(P), prf(M), du(d, 0.0);
        for (int c = 0; c < d; ++c) u[c] = xr[c] / norm;
        for (int p = 0; p < P; ++p) {
          adot[p] = dot(anchors + int64_t(p) * d, u.data(), d);
          anc[p] = adot[p] * adot[p] / std::sqrt(double(P));
        }
        std::vector<double> g_anc(P, 0.0);  // d loss / d phi_anc_p, summed over r, j
        for (int r = 0; r < R; ++r) {
          const double s = nodes[r], sw = std::sqrt(weights[r]), root = std::sqrt(2 * s);
          for (int j = 0; j < M; ++j) {
            const double* w = omega + (int64_t(r) * M + j) * d;
            prf[j] = std::exp(root * dot(w, u.data(), d) - s) / std::sqrt(double(M));
            double g_prf = 0;  // d loss / d phi_prf_j(u; s_r)
            for (int p = 0; p < P; ++p) {
              const double gi = g[(int64_t(r) * P + p) * M + j] * sw;
              g_prf += gi * anc[p];
              g_anc[p] += gi * prf[j];
            }
            for (int c = 0; c < d; ++c) du[c] += g_prf * prf[j] * root * w[c];
          }
        }
        for (int p = 0; p < P; ++p) {
          const double c = g_anc[p] * 2 * adot[p] / std::sqrt(double(P));
          for (int k = 0; k < d; ++k) du[k] += c * anchors[int64_t(p) * d + k];
        }
        // u = x/|x|: du/dx = (I - u u^T)/|x|.
        const double ud = dot(u.data(), du.data(), d);
        for (int c = 0; c < d; ++c) gx[c] += (du[c] - u[c] * ud) / norm;
        break;
      }
    }
  }
}

}  // namespace lunajit::reference
