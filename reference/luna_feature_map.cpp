// The luna feature map (docs/MATH.md §2, LUNA eq. 11) and its backward, in double.
//
// Per row x: u_i = W_i . x (M projections); psi_l(u_i) from the variant (neural
// channel MLP, bank of fixed bases with learned coefficients, or [cos, sin]);
// phi[i*L + l] = h(x)/sqrt(M) psi_l(u_i) with h the optional sigmoid envelope.
// L is dim_/M: the channels option, except 2 for the rff variant (feature_dim()).
// The backward walks the same steps in reverse, one row at a time, and adds each
// row's parameter gradient into dparams (the caller sums over rows, tokens,
// batches and, when params are shared, heads).
#include <cmath>
#include <vector>

#include "reference/feature_map.h"

namespace lunajit::reference {
namespace {

double sigmoid(double t) { return 1.0 / (1.0 + std::exp(-t)); }

// The pieces of one luna parameter block, resolved from the layout.
struct LunaParams {
  const double* W = nullptr;   // [M, d]
  const double* W1 = nullptr;  // [Hm] shared, [L, Hm] per channel
  const double* b1 = nullptr;
  const double* W2 = nullptr;  // [L, Hm]
  const double* b2 = nullptr;  // [L]
  const double* coef = nullptr;
  const double* a = nullptr;   // [d]
  const double* c = nullptr;   // [1]
};

// One MLP evaluation psi(u) for all L channels, keeping what the backward needs:
// the hidden pre-activations t and the output pre-activations y.
struct MlpTrace {
  std::vector<double> t;  // [Hm] shared, [L, Hm] per channel
  std::vector<double> y;  // [L]
};

void mlp_forward(const LunaOptions& o, const LunaParams& p, double u, MlpTrace& tr, double* psi) {
  const int L = o.channels, Hm = o.mlp_width;
  const int rows = o.shared_channels ? 1 : L;
  tr.t.resize(size_t(rows) * Hm);
  tr.y.resize(L);
  for (int k = 0; k < rows * Hm; ++k) tr.t[k] = p.W1[k] * u + p.b1[k];
  for (int l = 0; l < L; ++l) {
    const double* t = tr.t.data() + (o.shared_channels ? 0 : int64_t(l) * Hm);
    double y = p.b2[l];
    for (int k = 0; k < Hm; ++k) y += p.W2[int64_t(l) * Hm + k] * activation(o.activation, t[k]);
    tr.y[l] = y;
    psi[l] = output_activation(o.output_activation, y);
  }
}

}  // namespace

void FeatureMap::luna_forward(const double* x, int n, double* phi) const {
  const LunaOptions& o = spec_.luna;
  const int d = spec_.head_dim, M = o.projections, L = dim_ / M;
  auto at = [&](const char* name) { return offset(name) >= 0 ? p_.data() + offset(name) : nullptr; };
  const LunaParams p{at("W"), at("W1"), at("b1"), at("W2"), at("b2"), at("coef"), at("a"), at("c")};
  MlpTrace tr;
  std::vector<double> psi(L);
  for (int t = 0; t < n; ++t) {
    const double* xr = x + int64_t(t) * d;
    double* f = phi + int64_t(t) * M * L;
    double h = 1.0;
    if (o.envelope) {
      double z = p.c[0];
      for (int k = 0; k < d; ++k) z += p.a[k] * xr[k];
      h = sigmoid(z);
    }
    const double scale = h / std::sqrt(double(M));
    for (int i = 0; i < M; ++i) {
      double u = 0;
      for (int k = 0; k < d; ++k) u += p.W[int64_t(i) * d + k] * xr[k];
      switch (o.variant) {
        case LunaVariant::neural: mlp_forward(o, p, u, tr, psi.data()); break;
        case LunaVariant::bank_coef:
          for (int l = 0; l < L; ++l) psi[l] = p.coef[l] * bank_basis(l, u);
          break;
        case LunaVariant::rff:
          psi[0] = std::cos(u);
          psi[1] = std::sin(u);
          break;
      }
      for (int l = 0; l < L; ++l) f[i * L + l] = scale * psi[l];
    }
  }
}

void FeatureMap::luna_backward(const double* x, int n, const double* dphi, double* dx,
                               double* dparams) const {
  const LunaOptions& o = spec_.luna;
  const int d = spec_.head_dim, M = o.projections, L = dim_ / M, Hm = o.mlp_width;
  auto at = [&](const char* name) { return offset(name) >= 0 ? p_.data() + offset(name) : nullptr; };
  auto grad = [&](const char* name) { return learned(name) ? dparams + offset(name) : nullptr; };
  const LunaParams p{at("W"), at("W1"), at("b1"), at("W2"), at("b2"), at("coef"), at("a"), at("c")};
  double* gW = grad("W");
  double* gW1 = grad("W1");
  double* gb1 = grad("b1");
  double* gW2 = grad("W2");
  double* gb2 = grad("b2");
  double* gcoef = grad("coef");
  double* ga = grad("a");
  double* gc = grad("c");

  MlpTrace tr;
  std::vector<double> psi(L), dy(L), dt;
  for (int t = 0; t < n; ++t) {
    const double* xr = x + int64_t(t) * d;
    const double* g = dphi + int64_t(t) * M * L;
    double* gx = dx + int64_t(t) * d;
    double h = 1.0;
    if (o.envelope) {
      double z = p.c[0];
      for (int k = 0; k < d; ++k) z += p.a[k] * xr[k];
      h = sigmoid(z);
    }
    const double inv_sqrt_m = 1.0 / std::sqrt(double(M));
    double dh = 0;  // d loss / d h
    for (int i = 0; i < M; ++i) {
      const double* w = p.W + int64_t(i) * d;
      double u = 0;
      for (int k = 0; k < d; ++k) u += w[k] * xr[k];
      const double* gi = g + int64_t(i) * L;
      double du = 0;
      switch (o.variant) {
        case LunaVariant::neural: {
          mlp_forward(o, p, u, tr, psi.data());
          const int rows = o.shared_channels ? 1 : L;
          dt.assign(size_t(rows) * Hm, 0.0);  // d loss / d sigma(t), then / d t
          for (int l = 0; l < L; ++l) {
            dy[l] = gi[l] * h * inv_sqrt_m * output_activation_grad(o.output_activation, tr.y[l]);
            const int64_t row = o.shared_channels ? 0 : int64_t(l) * Hm;
            for (int k = 0; k < Hm; ++k) {
              dt[row + k] += dy[l] * p.W2[int64_t(l) * Hm + k];
              if (gW2) gW2[int64_t(l) * Hm + k] += dy[l] * activation(o.activation, tr.t[row + k]);
            }
            if (gb2) gb2[l] += dy[l];
          }
          for (int k = 0; k < rows * Hm; ++k) {
            dt[k] *= activation_grad(o.activation, tr.t[k]);
            du += dt[k] * p.W1[k];
            if (gW1) gW1[k] += dt[k] * u;
            if (gb1) gb1[k] += dt[k];
          }
          break;
        }
        case LunaVariant::bank_coef:
          for (int l = 0; l < L; ++l) {
            const double gp = gi[l] * h * inv_sqrt_m;
            psi[l] = p.coef[l] * bank_basis(l, u);
            du += gp * p.coef[l] * bank_basis_grad(l, u);
            if (gcoef) gcoef[l] += gp * bank_basis(l, u);
          }
          break;
        case LunaVariant::rff:
          psi[0] = std::cos(u);
          psi[1] = std::sin(u);
          du = h * inv_sqrt_m * (-gi[0] * std::sin(u) + gi[1] * std::cos(u));
          break;
      }
      for (int l = 0; l < L; ++l) dh += gi[l] * psi[l] * inv_sqrt_m;
      for (int k = 0; k < d; ++k) {
        gx[k] += du * w[k];
        if (gW) gW[int64_t(i) * d + k] += du * xr[k];
      }
    }
    if (o.envelope) {
      const double dz = dh * h * (1 - h);
      for (int k = 0; k < d; ++k) {
        gx[k] += dz * p.a[k];
        if (ga) ga[k] += dz * xr[k];
      }
      if (gc) gc[0] += dz;
    }
  }
}

}  // namespace lunajit::reference
