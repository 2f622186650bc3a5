#include "codegen/feature_params.h"

#include <cmath>
#include <numbers>
#include <random>

namespace lunajit {
namespace {

// Deterministic Gaussian and uniform draws. std::normal_distribution's algorithm
// is implementation-defined, so Box-Muller over mt19937_64 keeps parameters
// identical across standard libraries (the reference and the binding rely on it).
class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  double uniform() { return (static_cast<double>(gen_() >> 11) + 0.5) * 0x1.0p-53; }
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  double normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double r = std::sqrt(-2.0 * std::log(uniform()));
    const double t = 2.0 * std::numbers::pi * uniform();
    spare_ = r * std::sin(t);
    has_spare_ = true;
    return r * std::cos(t);
  }

 private:
  std::mt19937_64 gen_;
  bool has_spare_ = false;
  double spare_ = 0;
};

uint64_t mix_seed(uint64_t seed, uint64_t head, uint64_t tag) {
  uint64_t x = seed ^ (0x9E3779B97F4A7C15ull * (head + 1)) ^ (0xC2B2AE3D27D4EB4Full * (tag + 1));
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return x;
}

class LayoutBuilder {
 public:
  void add(std::string name, std::vector<int> shape, bool learned = true) {
    ParamTensor t{std::move(name), std::move(shape), offset_, learned};
    offset_ += t.numel();
    layout_.tensors.push_back(std::move(t));
  }
  ParamLayout finish() {
    layout_.per_head_floats = offset_;
    return std::move(layout_);
  }

 private:
  ParamLayout layout_;
  int64_t offset_ = 0;
};

// Rows of an m x d matrix whose d x d blocks are orthogonal (Gram-Schmidt of a
// Gaussian block), each row rescaled by the norm of an independent Gaussian
// vector (FAVOR+). A dozen lines, so no LAPACK dependency for one QR.
void orthogonal_gaussian(Rng& rng, int m, int d, float* out) {
  std::vector<double> block(static_cast<size_t>(d) * d);
  for (int row0 = 0; row0 < m; row0 += d) {
    for (auto& x : block) x = rng.normal();
    for (int i = 0; i < d; ++i) {
      double* ri = &block[static_cast<size_t>(i) * d];
      for (int j = 0; j < i; ++j) {
        const double* rj = &block[static_cast<size_t>(j) * d];
        double dot = 0;
        for (int c = 0; c < d; ++c) dot += ri[c] * rj[c];
        for (int c = 0; c < d; ++c) ri[c] -= dot * rj[c];
      }
      double norm = 0;
      for (int c = 0; c < d; ++c) norm += ri[c] * ri[c];
      norm = std::sqrt(norm);
      for (int c = 0; c < d; ++c) ri[c] /= norm;
    }
    for (int i = 0; i < d && row0 + i < m; ++i) {
      double scale = 0;
      for (int c = 0; c < d; ++c) {
        const double g = rng.normal();
        scale += g * g;
      }
      scale = std::sqrt(scale);
      for (int c = 0; c < d; ++c)
        out[static_cast<size_t>(row0 + i) * d + c] = static_cast<float>(block[static_cast<size_t>(i) * d + c] * scale);
    }
  }
}

}  // namespace

int64_t ParamTensor::numel() const {
  int64_t n = 1;
  for (int s : shape) n *= s;
  return n;
}

const ParamTensor* ParamLayout::find(const std::string& name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

int64_t ParamLayout::total_floats(const AttentionSpec& spec, int heads) const {
  return per_head_floats * (spec.params_per_head ? heads : 1);
}

ParamLayout param_layout(const AttentionSpec& s) {
  LayoutBuilder b;
  const int d = s.head_dim;
  switch (s.family) {
    case Family::luna: {
      const auto& o = s.luna;
      const int M = o.projections, L = o.channels, H = o.mlp_width;
      b.add("W", {M, d}, o.variant != LunaVariant::rff);
      if (o.variant == LunaVariant::neural) {
        if (o.shared_channels) {
          b.add("W1", {H});
          b.add("b1", {H});
          b.add("W2", {L, H});
          b.add("b2", {L});
        } else {
          b.add("W1", {L, H});
          b.add("b1", {L, H});
          b.add("W2", {L, H});
          b.add("b2", {L});
        }
      } else if (o.variant == LunaVariant::bank_coef) {
        b.add("coef", {L});
      }
      if (o.envelope) {
        b.add("a", {d});
        b.add("c", {1});
      }
      break;
    }
    case Family::performer: b.add("omega", {s.performer.features, d}, false); break;
    case Family::rff: b.add("omega", {s.rff.features, d}, false); break;
    case Family::t2r:
      b.add("W", {s.t2r.features, d});
      b.add("b", {s.t2r.features});
      break;
    case Family::hedgehog:
      b.add("W", {s.hedgehog.features, d});
      b.add("b", {s.hedgehog.features});
      break;
    case Family::slay:
      b.add("anchors", {s.slay.anchors, d}, false);
      b.add("omega", {s.slay.nodes, s.slay.prf_features, d}, false);
      b.add("nodes", {s.slay.nodes}, false);
      b.add("weights", {s.slay.nodes}, false);
      break;
    case Family::elu:
    case Family::relu:
    case Family::cosformer: break;
  }
  return b.finish();
}

void gauss_laguerre(int R, std::vector<double>& nodes, std::vector<double>& weights) {
  // Newton iteration on L_R with the classical starting guesses (Stroud & Secrest);
  // written here because no Debian library offers Gauss-Laguerre rules directly.
  nodes.assign(R, 0.0);
  weights.assign(R, 0.0);
  double z = 0;
  for (int i = 0; i < R; ++i) {
    if (i == 0) z = 3.0 / (1.0 + 2.4 * R);
    else if (i == 1) z += 15.0 / (1.0 + 2.5 * R);
    else z += (1.0 + 2.55 * (i - 1)) / (1.9 * (i - 1)) * (z - nodes[i - 2]);
    double pp = 0;
    for (int it = 0; it < 100; ++it) {
      double p1 = 1.0, p2 = 0.0;
      for (int j = 1; j <= R; ++j) {
        const double p3 = p2;
        p2 = p1;
        p1 = ((2 * j - 1 - z) * p2 - (j - 1) * p3) / j;
      }
      pp = R * (p1 - p2) / z;
      const double z1 = z;
      z = z1 - p1 / pp;
      if (std::abs(z - z1) <= 1e-15 * std::abs(z)) break;
    }
    // Weight from L_{R-1}(z): a = z / ((R+1)^2 L_{R+1}(z)^2) = 1 / (z L_R'(z)^2).
    nodes[i] = z;
    weights[i] = 1.0 / (z * pp * pp);
  }
}

std::vector<float> init_params(const AttentionSpec& s, int heads, uint64_t seed) {
  const ParamLayout layout = param_layout(s);
  const int blocks = s.params_per_head ? heads : 1;
  std::vector<float> buf(static_cast<size_t>(layout.per_head_floats) * blocks, 0.0f);
  const int d = s.head_dim;
  for (int h = 0; h < blocks; ++h) {
    float* base = buf.data() + static_cast<size_t>(h) * layout.per_head_floats;
    auto at = [&](const char* name) { return base + layout.find(name)->offset; };
    auto fill_uniform = [&](Rng& rng, const char* name, double bound) {
      const ParamTensor* t = layout.find(name);
      for (int64_t i = 0; i < t->numel(); ++i) base[t->offset + i] = static_cast<float>(rng.uniform(-bound, bound));
    };
    auto fill_normal = [&](Rng& rng, const char* name, double stddev) {
      const ParamTensor* t = layout.find(name);
      for (int64_t i = 0; i < t->numel(); ++i) base[t->offset + i] = static_cast<float>(stddev * rng.normal());
    };
    Rng learned(mix_seed(seed, h, 1));
    switch (s.family) {
      case Family::luna: {
        const auto& o = s.luna;
        Rng w_rng(o.variant == LunaVariant::rff ? mix_seed(seed, h, 7) : mix_seed(seed, h, 1));
        fill_normal(w_rng, "W", 1.0 / std::sqrt(static_cast<double>(d)));
        if (o.variant == LunaVariant::neural) {
          fill_uniform(learned, "W1", 1.0);  // fan_in 1
          fill_uniform(learned, "b1", 1.0);
          fill_uniform(learned, "W2", 1.0 / std::sqrt(static_cast<double>(o.mlp_width)));
          fill_uniform(learned, "b2", 1.0 / std::sqrt(static_cast<double>(o.mlp_width)));
        } else if (o.variant == LunaVariant::bank_coef) {
          for (int l = 0; l < o.channels; ++l) at("coef")[l] = 1.0f;
        }
        if (o.envelope) {
          fill_uniform(learned, "a", 1.0 / std::sqrt(static_cast<double>(d)));
          at("c")[0] = 0.0f;
        }
        break;
      }
      case Family::performer: {
        Rng fixed(mix_seed(s.performer.seed, s.params_per_head ? h : 0, 2));
        if (s.performer.orthogonal) {
          orthogonal_gaussian(fixed, s.performer.features, d, at("omega"));
        } else {
          fill_normal(fixed, "omega", 1.0);
        }
        break;
      }
      case Family::rff: {
        Rng fixed(mix_seed(s.rff.seed, s.params_per_head ? h : 0, 3));
        fill_normal(fixed, "omega", std::pow(static_cast<double>(d), -0.25));  // variance 1/sqrt(d)
        break;
      }
      case Family::t2r:
        fill_uniform(learned, "W", 1.0 / std::sqrt(static_cast<double>(d)));
        fill_uniform(learned, "b", 1.0 / std::sqrt(static_cast<double>(d)));
        break;
      case Family::hedgehog: {
        const int f = s.hedgehog.features;
        if (f == d) {
          for (int i = 0; i < f; ++i) at("W")[static_cast<size_t>(i) * d + i] = 1.0f;
        } else {
          fill_uniform(learned, "W", 1.0 / std::sqrt(static_cast<double>(d)));
        }
        break;
      }
      case Family::slay: {
        const auto& o = s.slay;
        Rng fixed(mix_seed(o.seed, s.params_per_head ? h : 0, 4));
        float* anchors = at("anchors");
        for (int p = 0; p < o.anchors; ++p) {
          double norm = 0;
          for (int c = 0; c < d; ++c) {
            const double g = fixed.normal();
            anchors[static_cast<size_t>(p) * d + c] = static_cast<float>(g);
            norm += g * g;
          }
          norm = std::sqrt(norm);
          for (int c = 0; c < d; ++c) anchors[static_cast<size_t>(p) * d + c] /= static_cast<float>(norm);
        }
        fill_normal(fixed, "omega", 1.0);
        std::vector<double> t, a;
        gauss_laguerre(o.nodes, t, a);
        const double C = 2.0 + o.eps_yat;
        for (int r = 0; r < o.nodes; ++r) {
          at("nodes")[r] = static_cast<float>(t[r] / C);
          at("weights")[r] = static_cast<float>(a[r] / C);
        }
        break;
      }
      case Family::elu:
      case Family::relu:
      case Family::cosformer: break;
    }
  }
  return buf;
}

}  // namespace lunajit
