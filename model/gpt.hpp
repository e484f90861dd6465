// The decoder as Megatron builds it: vocab-parallel word embedding, pre-norm transformer
// layers (column-parallel QKV and fc1, row-parallel proj and fc2, heads split across
// tensor-parallel ranks), a final norm and a vocab-parallel output layer with a
// vocab-parallel cross-entropy. One model, two families by its parts (GptConfig):
//   GPT-2 / MT-NLG  learned positions, LayerNorm, GELU MLP, biases, output tied to the
//                   word embedding;
//   Llama family    rotary positions in each layer, RMSNorm, SwiGLU MLP, grouped-query
//                   attention, no biases (Qwen2: q/k/v biases), an untied output layer.
// Each part is chosen once, where the layer is built (model/parts.hpp); the layer code
// calls the part, not a flag.
//
// A GptChunk is the slice of layers one pipeline rank runs for one model chunk
// (virtual stage). It has explicit forward/backward per micro batch; activations of
// micro batches in flight are kept per micro-batch id until their backward.
//
// Tensor-parallel regions are the named pairs of model/tp_regions.hpp. With sequence
// parallelism the rows (tokens) of the residual stream are split across tp ranks.
// Rows are (sample, position) in sample-major order.
//
// With context parallelism (the groups' cp of more than one rank) a training or scoring
// call holds this cp rank's rows of every sequence: chunks r and 2cp-1-r of its 2cp equal
// chunks (parallel/context_parallel.hpp), at their global positions. The chunk takes the
// whole [B, T + 1] token rows and the [B, T] loss mask and picks its rows itself; the
// residual stream, the pipeline's messages and the loss cover those rows only, and
// attention runs across the cp group. Inference runs without it.
//
// One layer stack serves training, scoring and inference, each through its own entry
// (forward/backward, score, infer) with its own input type and its own head. Scoring and
// inference are forward only: nothing is kept for a backward. With a
// KvCache the new tokens sit at positions cache.length.., attend to the cached keys
// and values as well as causally to each other, and are appended to the cache — a
// prompt is prefilled in one call, then each generated token is one call.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "config/model.hpp"
#include "config/parallel.hpp"
#include "config/training.hpp"
#include "core/ops.hpp"
#include "core/tensor.hpp"
#include "model/moe.hpp"
#include "model/params.hpp"
#include "model/parts.hpp"
#include "parallel/communicator.hpp"

namespace mtnlg::parallel {
class CpExchange;
}

namespace mtnlg::model {

// What the model is built from. The app makes it from a recipe (app::gpt_config in
// app/process/module_configs.hpp); model/ never sees the recipe itself.
struct GptConfig {
  int64_t vocab_size = 0;         // real vocabulary (50257 for GPT-2)
  int64_t padded_vocab_size = 0;  // multiple of make_vocab_size_divisible_by * tp
  int64_t hidden = 0, heads = 0, ffn = 0, seq_length = 0, max_positions = 0;
  int64_t num_layers_total = 0;
  double init_std = 0.02, hidden_dropout = 0.0, attention_dropout = 0.0, layernorm_eps = 1e-5;
  // The architecture's parts (defaults: GPT-2). groups: key/value heads (grouped-query
  // attention; 0 = heads); head_size 0 = hidden / heads.
  int64_t groups = 0, head_size = 0;
  bool rope = false;  // rotary positions (rope_params) instead of a learned table
  ops::RopeParams rope_params;
  bool rmsnorm = false;     // RMSNorm instead of LayerNorm (no norm biases)
  bool swiglu = false;      // gated MLP: fc1 is gate and up, each ffn wide
  bool untied = false;      // an output layer of its own instead of the word embedding
  bool bias_linear = true;  // biases of proj, fc1 and fc2 (and of qkv)
  bool qkv_bias = true;     // biases of qkv (bias_linear, or Qwen2's add_qkv_bias)
  bool qk_norm = false;     // Qwen3's RMSNorm of each query and key head (before the rotary embedding)
  MoeLayerConfig moe;       // which layers' MLP is routed experts, and how (model/moe.hpp)
  RecomputeGranularity recompute = RecomputeGranularity::none;
  AttentionBackend attention = AttentionBackend::automatic;  // resolved per device by GptChunk
  int64_t micro_batch_size = 1;  // the training micro batch (the shape auto tries the flash form on)
  bool sequence_parallel = false;
  CpCommType cp_comm = CpCommType::p2p;  // attention across the cp group (ProcessGroups::cp)
  int64_t cp_a2a_size = 0;               // a2a+p2p: the a2a groups' size (hierarchical_context_parallel_sizes[0])
  uint64_t seed = 1234;
  DType dtype = DType::f32;  // activations and the compute copy of the weights
  // The most logits the last stage computes at once (rows x this rank's vocabulary shard):
  // the loss and its backward through the logits run a chunk of rows at a time
  // (logits_chunk_rows). 2^28: 512 MiB in bf16.
  int64_t logits_chunk_elements = int64_t{1} << 28;

  int64_t head_dim() const { return head_size > 0 ? head_size : hidden / heads; }
  int64_t kv_groups() const { return groups > 0 ? groups : heads; }
  // Output features of the fused qkv projection (all ranks): the query heads and one key
  // and one value head per group.
  int64_t qkv_width() const { return (heads + 2 * kv_groups()) * head_dim(); }
  int64_t attention_width() const { return heads * head_dim(); }  // the query heads' channels
};

// Rows of logits the last stage computes at once for `rows` rows over a vocabulary shard of
// `vocab_local` columns: as many as `elements` allow, at least one, all when they fit.
int64_t logits_chunk_rows(int64_t rows, int64_t vocab_local, int64_t elements);

// The activation / compute-weight dtype of a training precision (fp32 -> f32, bf16 ->
// bf16, fp16 -> f16). Master weights, gradients and statistics stay fp32.
DType compute_dtype(Precision p);

// Which layers a chunk owns and whether it holds the embedding / the output head.
struct ChunkSpec {
  int64_t first_layer = 0;
  int64_t num_layers = 0;
  bool has_embedding = false;  // first virtual stage of the pipeline
  bool has_head = false;       // last virtual stage of the pipeline
  std::string prefix;          // parameter-name prefix ("" for the only chunk)
};

// Declares the chunk's parameters (this tp rank's shards) in `store`.
void declare_chunk_params(ParamStore& store, const GptConfig& cfg, const ChunkSpec& spec, int64_t tp_rank,
                          int64_t tp_size);

// The chunk serves three purposes, each with its own input and its own head, over the
// same layer stack:
//   training   TrainMicroBatch -> forward + backward; the last stage's loss goes to the
//              device accumulator and the head's backward runs inside the forward;
//   scoring    ScoreMicroBatch -> forward only over teacher-forced tokens: the loss terms
//              (validation) or per-token log-probabilities (eval across tp x pp ranks);
//   inference  InferenceCall -> forward only over inputs without labels: the hidden states,
//              or the logits of some rows (eval's batched scoring, generation with a KvCache).
struct KvCache;

// One training micro batch: tokens[b, 0..T] for b < micro_batch_size; inputs are
// tokens[:, :T], labels tokens[:, 1:]. sample_offset = global index of sample 0 (the
// dropout masks and thus the run are keyed by it, with step_key). loss_weight multiplies
// the loss gradient: 1 / (tokens contributing to the global batch), so gradients sum to
// the batch mean (times the fp16 loss scale).
struct TrainMicroBatch {
  const int32_t* tokens = nullptr;
  int64_t micro_batch_size = 0;
  int64_t sample_offset = 0;
  uint64_t step_key = 0;             // dropout key for this iteration
  double loss_weight = 1.0;          // d(total loss)/d(sum of this micro batch's token losses)
  const float* loss_mask = nullptr;  // optional [B*T], 1 = counts (eod_mask_loss)
  // d(total loss)/d(this micro batch's MoE balancing and z losses): Megatron-Core scales
  // them per micro batch, 1 / (micro batches x dp) (times the fp16 loss scale).
  double moe_loss_weight = 1.0;
  // The last stage adds (sum of token losses, tokens counted) to this f64 [2] tensor on the
  // model's device and reads nothing back (the trainer reads it once per step). Null: the
  // loss terms are read on the host into ForwardResult (tests and oracles).
  Tensor* loss_acc = nullptr;
};

// One scoring micro batch: teacher-forced tokens[b, 0..T] as in training, forward only, on
// a model without dropout. The last stage adds the loss terms to `loss_acc` when given
// (validation), else reads them on the host into ForwardResult, with per-token scores when
// asked (eval across pipeline stages).
struct ScoreMicroBatch {
  const int32_t* tokens = nullptr;
  int64_t micro_batch_size = 0;
  const float* loss_mask = nullptr;  // optional [B*T], 1 = counts
  Tensor* loss_acc = nullptr;
  bool token_scores = false;  // fill ForwardResult::token_logprob / token_greedy
};

// One inference call on a model without dropout or sequence parallelism: inputs only,
// tokens[b, 0..seq_len) (no labels).
struct InferenceCall {
  const int32_t* tokens = nullptr;
  int64_t batch = 0;
  int64_t seq_len = 0;  // tokens per sample in this call; 0 = cfg.seq_length
  // Optional key/value cache of this chunk's layers: the call's tokens are at positions
  // kv->length .. kv->length + seq_len - 1 and kv->length advances by seq_len.
  KvCache* kv = nullptr;
  // Last stage: ForwardResult::logits for these rows (b*T + t). Without them the call
  // returns the chunk output (before the final norm).
  const std::vector<int64_t>* logit_rows = nullptr;
};

// Keys and values of the positions a chunk has already run, per layer of the chunk:
// [batch, local heads, capacity, head size] on the chunk's device in its activation
// dtype (GptChunk::make_kv_cache). Positions [0, length) of every sample are filled.
struct KvCache {
  int64_t batch = 0, capacity = 0, length = 0;
  std::vector<Tensor> k, v;
};

// Where each input sits in the one i32 buffer a micro batch's token ids are placed in (one
// upload). Its sizes depend on the micro batch's shape alone, so a CUDA graph's buffers fit
// every later micro batch of the shape. -1: not part of this layout.
struct PlacedLayout {
  int64_t tokens = 0;       // N = B x T
  int64_t inputs = 0;       // the input ids [N]
  int64_t labels = 0;       // the labels [N] (zeros for inference)
  int64_t grad_order = -1;  // the first stage's grouping by token for the embedding backward
                            // (ops::embedding_grad_order, 2N + 2; CUDA training)
  int64_t keys = -1;        // the step's dropout key and the micro batch's first sample, two
                            // u64 at an even index (CUDA training: DeviceKey, core/rng.hpp)
  int64_t total = 0;        // i32 elements in all

  static PlacedLayout make(int64_t tokens, bool grad_order, bool keys);
  static constexpr int64_t kGradOrderExtra = 2;  // grad_order holds 2N + this
  static constexpr int64_t kKeyWords = 4;        // two u64 as i32
};

// A training micro batch's inputs in one place, host or device: `ids` in the PlacedLayout,
// and on the last stage `dloss`, the loss gradient per token (loss_weight x mask) [N] in
// the statistics dtype, and with TrainMicroBatch::loss_mask `mask` f32 [N] (1 = counts).
// GptChunk::stage_inputs builds them on the host; on() puts them on the model's device
// (the eager forward), copy_from refills device buffers (a CUDA graph's, which the replay
// reads where its capture did).
struct PlacedInputs {
  PlacedLayout layout;
  Tensor ids, dloss, mask;
  Tensor moe_dloss;  // f64 [1]: TrainMicroBatch::moe_loss_weight, on a chunk with MoE layers

  Tensor inputs() const { return ids.flat(layout.inputs, layout.tokens); }
  Tensor labels() const { return ids.flat(layout.labels, layout.tokens); }
  // Buffers of the same layout, shapes and dtypes on `dev` (uninitialised).
  PlacedInputs empty_like(Device dev) const;
  // This on `dev` (one upload per tensor).
  PlacedInputs on(Device dev) const;
  // Copies `src` (same layout) into these buffers, queued on the stream.
  void copy_from(const PlacedInputs& src);
};

// What a forward call returns; which fields are set depends on the purpose and the stage.
struct ForwardResult {
  Tensor output;           // activations to send on (not the last stage; inference without logit rows)
  double loss_sum = 0.0;   // sum of token losses (last stage, without a loss accumulator)
  double loss_tokens = 0;  // tokens counted (last stage, without a loss accumulator)
  // With ScoreMicroBatch::token_scores, per token (row b*T+t): log p(label) over the real
  // vocabulary, and whether the label's logit is the largest one (greedy).
  std::vector<double> token_logprob;
  std::vector<uint8_t> token_greedy;
  // With InferenceCall::logit_rows (last stage): [rows, padded vocab] in the activation
  // dtype on the chunk's device, gathered over tp; columns >= vocab_size are padding.
  Tensor logits;
};

class GptChunk {
 public:
  GptChunk(const GptConfig& cfg, ChunkSpec spec, ParamStore& store, const parallel::ProcessGroups& groups);
  ~GptChunk();

  // ---- training ----
  // input: [rows, hidden] activations from the previous stage (ignored on the first).
  // Activations are kept for the backward under `mb_id`. The first form places the micro
  // batch's inputs itself (stage_inputs, then PlacedInputs::on); the second reads them
  // from `placed` (a CUDA graph's buffers), which must stay alive until the backward.
  ForwardResult forward(int64_t mb_id, const TrainMicroBatch& mb, const Tensor& input);
  ForwardResult forward(int64_t mb_id, const TrainMicroBatch& mb, const PlacedInputs& placed, const Tensor& input);
  // dout: gradient w.r.t. this chunk's output (ignored on the last chunk, which starts
  // from the loss). Returns the gradient w.r.t. the input (empty on the first chunk).
  // Parameter gradients accumulate into the store (fp32); activations are cfg.dtype.
  // last_backward: the chunk's last micro batch of the step; as its backward passes a
  // layer, that layer's parameter gradients are final (reported to the grad-ready hook).
  Tensor backward(int64_t mb_id, const Tensor& dout, bool last_backward = false);
  // A training micro batch's inputs on the host, in this chunk's layout: what forward
  // places, and what a CUDA graph's caller copies into its buffers before a replay.
  PlacedInputs stage_inputs(const TrainMicroBatch& mb) const;

  // ---- scoring and inference (forward only, nothing kept) ----
  ForwardResult score(const ScoreMicroBatch& mb, const Tensor& input);
  ForwardResult infer(const InferenceCall& call, const Tensor& input);

  // Rows of the residual stream this rank holds for a micro batch of `mbs` samples of
  // `seq_len` tokens (0 = a training or scoring call: cfg.seq_length, this cp rank's
  // share of it under context parallelism).
  int64_t local_rows(int64_t mbs, int64_t seq_len = 0) const;
  // An empty cache for `batch` samples of up to `capacity` positions (InferenceCall::kv).
  KvCache make_kv_cache(int64_t batch, int64_t capacity) const;
  const GptConfig& config() const { return cfg_; }
  const ChunkSpec& spec() const { return spec_; }
  DType activation_dtype() const { return cfg_.dtype; }
  // The attention form this chunk runs: the recipe's, with auto resolved for its device
  // (flash on the CPU; on CUDA flash where cuDNN takes the training shape, else unfused).
  AttentionBackend attention_backend() const { return attention_; }
  // The form and why: "flash (cuDNN fused attention, cuDNN 9.19.0 (libcudnn.so.9))",
  // "unfused (flash: <what refused it>)", "flash (the CPU's row kernel)", "unfused".
  const std::string& attention_note() const { return attention_note_; }
  // Where this chunk's weights, activations and statistics live (the store's device).
  Device device() const { return dev_; }
  // Activation bytes currently held for micro batches in flight.
  int64_t saved_bytes() const;
  // Called with a parameter's offset in the store once its gradient is final for the
  // step (during a backward with last_backward): the data-parallel
  // reduction (parallel::DataParallelGrads) starts full buckets from it.
  void set_grad_ready_hook(std::function<void(int64_t)> hook) { grad_ready_ = std::move(hook); }
  // MoE layers: this step's routing record per MoE layer of the chunk (the trainer resets it
  // before a step's forwards and reads it after), and the aux-loss-free balancing's bias
  // update from it (the sign rule, once per global batch; layers with an expert bias).
  const std::vector<MoeLayerStats>& moe_stats() const { return moe_stats_; }
  // The trainer replaces them with the whole job's (its ranks' tokens summed) before the
  // expert-bias update reads them.
  std::vector<MoeLayerStats>& moe_stats() { return moe_stats_; }
  void reset_moe_stats();
  void update_expert_bias();
  void drop_saved();  // forget activations of micro batches in flight (eval, aborted steps)
  // Called during a training forward with the embedding's output (layer -1) and each
  // layer's output (the layer's index in the whole model): the trainer's spike forensics
  // looks for the first non-finite activation, and fault injection poisons one. The
  // default (none) costs nothing.
  using LayerObserver = std::function<void(int64_t layer, const TrainMicroBatch& mb, Tensor& out)>;
  void set_layer_observer(LayerObserver f) { observer_ = std::move(f); }

 private:
  struct LayerActs;
  struct Saved;
  // A layer's weights and gradients; the ones the architecture lacks (biases, LayerNorm
  // biases under RMSNorm) stay undefined. Under SwiGLU fc1 is gate and up as one weight.
  struct LayerParams {
    Tensor ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc1_w, fc1_b, fc2_w, fc2_b;
    Tensor d_ln1_w, d_ln1_b, d_qkv_w, d_qkv_b, d_proj_w, d_proj_b, d_ln2_w, d_ln2_b, d_fc1_w, d_fc1_b, d_fc2_w, d_fc2_b;
    Tensor q_norm_w, k_norm_w, d_q_norm_w, d_k_norm_w;  // qk_norm only
    bool moe = false;                                   // routed experts instead of fc1/fc2
    MoeParams moe_p;
  };
  void bind_moe(LayerParams& lp, const std::string& prefix, std::vector<int64_t>& offsets);
  void setup_moe();
  void bind_layer(int64_t layer);

  // One forward call as the layer stack sees it, whatever its purpose: its shape, its
  // cache, and the dropout keys (training: the step key, the micro batch's first sample,
  // and on CUDA their placed copy, from which the dropout kernels derive theirs).
  enum class Purpose { train, score, infer };
  struct Pass {
    Purpose purpose = Purpose::train;
    int64_t batch = 0, seq = 0, past = 0;
    bool cp = false;  // the rows are this cp rank's share of each sequence (seq = T / cp)
    KvCache* kv = nullptr;
    uint64_t step_key = 0;
    int64_t sample_offset = 0;
    const uint64_t* keys_dev = nullptr;
    Tensor moe_dloss;  // TrainMicroBatch::moe_loss_weight on the chunk's device (PlacedInputs::moe_dloss)
    const TrainMicroBatch* train = nullptr;  // the layer observer's argument (training forward)
    int64_t tokens() const { return batch * seq; }
  };

  // The parts of a forward call, in order: check it, place the token ids, embed (first
  // stage) or take the input, run the layers, then the purpose's head.
  void check_call(const Pass& p) const;
  PlacedLayout train_layout(int64_t tokens) const;
  void take_placed(const PlacedInputs& in, Pass& p, Saved& s) const;
  void place_unlabelled(const int32_t* tokens, const Pass& p, Saved& s) const;
  void place_teacher_forced(const int32_t* tokens, const Pass& p, Saved& s) const;
  Tensor embed(const Pass& p, const Tensor& tokens);
  Tensor checked_input(const Tensor& input, const Pass& p) const;
  Tensor run_layers(Tensor x, const Pass& p, Saved& s);
  Tensor stack_forward(const Pass& p, Saved& s, const Tensor& input);
  void head_train(const Tensor& x, const TrainMicroBatch& mb, Saved& s, ForwardResult& res);
  void head_score(const Tensor& x, const ScoreMicroBatch& mb, Saved& s, ForwardResult& res);
  Tensor head_logits(const Tensor& x, const std::vector<int64_t>& rows);
  // The loss statistics of the last stage: the final LayerNorm (unless the last layer's
  // residual add computed it), the logits a chunk of rows at a time against this rank's
  // vocabulary shard (logits_chunk_rows), their row max, sum of exp and target logit
  // reduced over tp. `each` sees every chunk while its logits exist (rows r0 .. r0 + n,
  // the final LayerNorm's rows `in`); the statistics fill `st`.
  struct LossStats {
    Tensor rowmax, sumexp, target_logit;
  };
  using LogitsChunkFn =
      std::function<void(int64_t r0, int64_t n, Tensor& logits, const Tensor& in, const LossStats& st)>;
  LossStats head_loss_stats(const Tensor& x, Saved& s, const LogitsChunkFn& each);
  // The loss terms read on the host (tests, eval): the sums, and per token when asked.
  void read_loss_terms(const LossStats& st, const float* loss_mask, bool token_scores, ForwardResult& res) const;
  // The LayerNorm that reads a layer's output y, computed in the same pass as y's
  // residual add (ops::residual_layernorm_forward): the next layer's input LayerNorm, or
  // the final LayerNorm on the last stage. run_layers allocates it.
  struct NextNorm {
    Tensor *out, *mean, *rstd;
    const Tensor *w, *b;  // b: undefined under RMSNorm
  };
  NextNorm next_norm(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& w, const Tensor& b, int64_t rows) const;
  // Without `next`, y alone (ops::residual_add_forward). The layer's own input LayerNorm is
  // computed here unless a.ln1 already holds it (the previous layer's `next`).
  void layer_forward(int64_t li, const Tensor& x, Tensor& y, LayerActs& a, const Pass& p,
                     const NextNorm* next = nullptr);
  // Statistics (LayerNorm mean/rstd, attention lse, loss terms): f64 for f64 models, else f32.
  DType stats_dtype() const { return cfg_.dtype == DType::f64 ? DType::f64 : DType::f32; }
  void layer_backward(int64_t li, const Tensor& dy, Tensor& dx, LayerActs& a, const Pass& p);
  // The MLP branch of a layer, dense or MoE: fc2's output from a.ln2_full (reduced over tp),
  // and the gradient of ln2 (this rank's rows) from fc2's output gradient.
  Tensor mlp_forward(int64_t li, LayerActs& a, const Pass& p);
  Tensor mlp_backward(int64_t li, const Tensor& dfc2, LayerActs& a, const Pass& p);
  // The attention core of layer_forward / layer_backward in the chunk's form.
  void attention_core_forward(LayerActs& a, const Pass& p, int64_t layer);
  Tensor attention_core_backward(const Tensor& datt, LayerActs& a, const Pass& p, int64_t layer);
  // One dropout site's mask for a micro batch: the key and first mask index the ops take,
  // and the same to be derived on the device from p.keys_dev (inert without it).
  struct DropSite {
    uint64_t key = 0, base = 0;
    DeviceKey dkey;
  };
  DropSite drop_site(const Pass& p, int64_t layer, int64_t site, uint64_t per_sample, uint64_t add) const;
  // A hidden-dropout site over this rank's `local_rows` rows of the residual stream
  // ([local rows, hidden]); forward and backward ask it, so their masks are the same draws.
  DropSite hidden_drop(const Pass& p, int64_t layer, int64_t site, int64_t local_rows) const;
  Tensor hidden_dropout_grad(const Tensor& g, const Pass& p, int64_t layer, int64_t site) const;
  ops::AttentionDropout attention_dropout(const Pass& p, int64_t layer) const;
  // Context parallelism's pieces: the sequence length a training or scoring call holds;
  // tokens [B, T + 1] into this rank's inputs and labels [B x L]; a [B, T] mask's rows of
  // this rank; the rotary embedding at the rows' global positions (forward, or its
  // backward); a position table's rows at them [L, C], and its gradient added back.
  int64_t call_seq() const { return cfg_.seq_length / cp_; }
  void split_tokens(const int32_t* tokens, int64_t B, int32_t* inputs, int32_t* labels) const;
  std::vector<float> local_mask(const float* mask, int64_t B) const;
  void rotate(Tensor& qkv, const Pass& p, bool backward) const;
  Tensor position_rows(const Tensor& table) const;
  void add_position_rows_grad(Tensor& dtable, const Tensor& drows) const;

  GptConfig cfg_;
  ChunkSpec spec_;
  ParamStore& store_;
  parallel::ProcessGroups groups_;
  int64_t cp_ = 1, cp_rank_ = 0;
  std::vector<int64_t> cp_pos_;  // the global position of each of a sequence's local rows
  std::unique_ptr<parallel::CpExchange> cp_ex_;
  int64_t tp_ = 1, tp_rank_ = 0, heads_local_ = 0, groups_local_ = 0, ffn_local_ = 0, vocab_local_ = 0,
          vocab_start_ = 0, vocab_valid_ = 0;
  Norm norm_;
  Mlp mlp_;
  MoeMlp moe_;
  std::vector<MoeLayerStats> moe_stats_;  // per MoE layer of the chunk (MoeLayerStats::layer)
  std::vector<int64_t> moe_stat_index_;   // per layer of the chunk: its moe_stats_ entry, -1 dense
  bool recomputing_ = false;              // a full-recompute forward: records no routing
  Rotary rotary_;
  QkNorm qk_norm_;
  std::vector<LayerParams> layers_;
  Tensor wte_, wpe_, lnf_w_, lnf_b_, d_wte_, d_wpe_, d_lnf_w_, d_lnf_b_;
  Tensor out_w_, d_out_w_;  // the output layer: the word embedding, or output_layer.weight untied
  std::map<int64_t, std::unique_ptr<Saved>> saved_;
  std::function<void(int64_t)> grad_ready_;
  LayerObserver observer_;
  Device dev_ = Device::cpu;
  AttentionBackend attention_ = AttentionBackend::flash;
  std::string attention_note_;
  void resolve_attention();
  bool flash_for_call(const Pass& p) const;
  bool cp_fused_for_call(int64_t B, int64_t L, double dropout_p, std::string* why = nullptr) const;
  std::vector<std::vector<int64_t>> layer_param_offsets_;  // per layer, in the store
  std::vector<int64_t> head_param_offsets_, embedding_param_offsets_;
  void report_ready(const std::vector<int64_t>& offsets, bool last_backward) const {
    if (last_backward && grad_ready_)
      for (int64_t o : offsets) grad_ready_(o);
  }
};

}  // namespace mtnlg::model
