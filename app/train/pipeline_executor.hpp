// Runs one global batch through this rank's model chunks following the pipeline
// schedule table for (pp, pp rank, microbatches, virtual chunks): forward and backward
// per micro batch, activations and their gradients exchanged with the neighbouring
// stages. With pp = 1 it is plain gradient accumulation.
#pragma once
#include <memory>
#include <vector>

#include "app/train/micro_batch_graphs.hpp"
#include "config/recipe.hpp"
#include "data/sample_source.hpp"
#include "model/gpt.hpp"
#include "parallel/communicator.hpp"

namespace mtnlg::app {

// data.eod_mask_loss: the end-of-document token of the recipe's tokenizer (HuggingFaceTokenizer:
// eos_token of the tokenizer_config.json beside data.tokenizer_model; GPT2BPETokenizer: the
// "<|endoftext|>" entry of data.vocab_file, or GPT-2's 50256), and the loss mask of
// `samples` token rows of seq_length+1 (inputs are the first seq_length): 0 where the
// input token is it, as Megatron's GPT dataset. Returns the count of ones in `count`.
int32_t eod_token(const Recipe& r);
std::vector<float> eod_loss_mask(const int32_t* rows, int64_t samples, int64_t seq_length, int32_t eod, double& count);

class PipelineExecutor {
 public:
  PipelineExecutor(const Recipe& r, const parallel::ProcessGroups& g,
                   std::vector<std::unique_ptr<model::GptChunk>>& chunks);
  // `consumed_before`: samples consumed before this batch (keys the data and dropout).
  // `loss_scale` multiplies the loss gradient (fp16 dynamic loss scaling). The last
  // stage adds its (unscaled) sum of token losses and the tokens counted to `loss_acc`
  // (f64 [2] on the model's device); nothing is read back to the host here.
  void run_batch(const data::Batch& batch, int64_t consumed_before, uint64_t step_key, double loss_scale,
                 Tensor& loss_acc);
  // Largest activation memory held at once during the last batch (bytes).
  int64_t peak_activation_bytes() const { return peak_act_; }
  // Largest bytes held at once during the last batch by sends not yet waited for (their
  // buffers: chunk outputs and input gradients; see schedules::send_release_points).
  int64_t peak_send_buffer_bytes() const { return peak_send_; }
  // Spike forensics, while it replays a step: when set, the last stage fills `out` with
  // each of this rank's micro batches' mean token loss (NaN where not run here; -1 after
  // the accumulated sum has gone non-finite, when a micro batch's own loss cannot be told)
  // by reading the loss accumulator after each forward (a host read per micro batch; the
  // arithmetic of the step is unchanged). Null (the default): nothing is read.
  void set_micro_batch_losses(std::vector<double>* out) { mb_losses_ = out; }
  // training.enable_cuda_graph (app/train/micro_batch_graphs.hpp; the layout is checked by
  // cuda_graph_refusal first): micro batches run through CUDA graphs, but the step's last
  // one when `eager_last_micro_batch` (its backward starts the overlapped dp reduction).
  void enable_cuda_graphs(bool eager_last_micro_batch);
  const MicroBatchGraphs* cuda_graphs() const { return graphs_.get(); }

 private:
  model::TrainMicroBatch micro_batch(const data::Batch& b, int64_t k, int64_t consumed_before, uint64_t step_key,
                                     double loss_scale) const;
  // data.eod_mask_loss: per micro batch, 0 where the input token is <|endoftext|> (as
  // Megatron's GPT dataset), and the global batch's count of tokens that remain, which
  // normalises the loss gradient (so the gradient is that of the reported per-token loss).
  void build_loss_masks(const data::Batch& b);
  void record_micro_batch_loss(int64_t microbatch, const Tensor& loss_acc);
  // One batch's schedule run: the tensors in flight between actions and the sends not yet
  // waited for (pipeline_executor.cpp).
  struct BatchRun;

  const Recipe& r_;
  parallel::ProcessGroups g_;
  std::vector<std::unique_ptr<model::GptChunk>>& chunks_;
  int64_t peak_act_ = 0;
  int64_t peak_send_ = 0;
  int32_t eod_ = -1;  // <|endoftext|> with data.eod_mask_loss, else -1
  std::vector<std::vector<float>> masks_;
  double counted_tokens_ = 0;  // global batch tokens that count (eod_mask_loss)
  std::vector<double>* mb_losses_ = nullptr;
  std::unique_ptr<MicroBatchGraphs> graphs_;
  bool graphs_eager_last_ = false;
  double mb_loss_sum_ = 0, mb_loss_tokens_ = 0;  // the accumulator at the previous record
};

}  // namespace mtnlg::app
