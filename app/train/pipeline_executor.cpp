#include "app/train/pipeline_executor.hpp"

#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "app/process/recipe_tokenizer.hpp"
#include "core/mem_account.hpp"
#include "core/ops.hpp"
#include "core/step_parts.hpp"
#include "parallel/flight_recorder.hpp"
#include "schedules/pipeline_schedule.hpp"

namespace mtnlg::app {

int32_t eod_token(const Recipe& r) {
  if (r.data.tokenizer_type == TokenizerType::huggingface) return recipe_hf_eod_token(r);
  if (r.data.vocab_file.empty()) return 50256;
  std::ifstream in(r.data.vocab_file);
  if (!in)
    throw_input("data.vocab_file {}: cannot read (data.eod_mask_loss needs its <|endoftext|> id)", r.data.vocab_file);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw_input("data.vocab_file {}: not a JSON vocabulary ({})", r.data.vocab_file, e.what());
  }
  if (!j.contains("<|endoftext|>") || !j["<|endoftext|>"].is_number_integer())
    throw_input("data.vocab_file {}: no <|endoftext|> entry, which data.eod_mask_loss masks", r.data.vocab_file);
  return j["<|endoftext|>"].get<int32_t>();
}

std::vector<float> eod_loss_mask(const int32_t* rows, int64_t samples, int64_t seq_length, int32_t eod, double& count) {
  std::vector<float> mask(static_cast<size_t>(samples * seq_length), 1.0f);
  for (int64_t s = 0; s < samples; ++s)
    for (int64_t t = 0; t < seq_length; ++t)
      if (rows[s * (seq_length + 1) + t] == eod) mask[static_cast<size_t>(s * seq_length + t)] = 0.0f;
  for (float m : mask) count += m;
  return mask;
}

PipelineExecutor::PipelineExecutor(const Recipe& r, const parallel::ProcessGroups& g,
                                   std::vector<std::unique_ptr<model::GptChunk>>& chunks)
    : r_(r), g_(g), chunks_(chunks) {
  if (r.data.eod_mask_loss) eod_ = eod_token(r);
}

void PipelineExecutor::build_loss_masks(const data::Batch& b) {
  const int64_t T = r_.model.seq_length, mbs = b.micro_batch_size;
  masks_.clear();
  double local = 0;
  for (int64_t k = 0; k < b.micro_batches; ++k)
    masks_.push_back(eod_loss_mask(b.tokens.data() + k * mbs * (T + 1), mbs, T, eod_, local));
  // Every tp x cp x pp rank of a data-parallel replica holds the same samples (a cp rank
  // counts the whole sequences, not its share): the global count is the sum over world
  // divided by tp x cp x pp (a host all-reduce, once per step).
  double sum = local;
  if (g_.world && g_.world->size() > 1) g_.world->all_reduce(&sum, 1, parallel::ReduceOp::sum);
  counted_tokens_ = sum / static_cast<double>(g_.topo.tp() * g_.topo.cp() * g_.topo.pp());
}

model::TrainMicroBatch PipelineExecutor::micro_batch(const data::Batch& b, int64_t k, int64_t consumed_before,
                                                     uint64_t step_key, double loss_scale) const {
  const int64_t T = r_.model.seq_length, mbs = b.micro_batch_size, dp = g_.topo.dp();
  model::TrainMicroBatch mb;
  mb.tokens = b.tokens.data() + k * mbs * (T + 1);
  mb.micro_batch_size = mbs;
  // Megatron's sampler: micro batch k of the step takes mbs*dp consecutive samples and
  // data-parallel rank r the slice [r*mbs, (r+1)*mbs) of them.
  mb.sample_offset = consumed_before + k * mbs * dp + g_.coord.dp * mbs;
  mb.step_key = step_key;
  mb.loss_weight = loss_scale / static_cast<double>(b.global_batch_size * T);
  // Megatron-Core's MoE losses: each micro batch's counts 1 / (micro batches x dp), the
  // average over the global batch's micro batches, whatever the loss mask.
  mb.moe_loss_weight = loss_scale * static_cast<double>(mbs) / static_cast<double>(b.global_batch_size);
  if (eod_ >= 0) {
    mb.loss_mask = masks_[static_cast<size_t>(k)].data();
    mb.loss_weight = counted_tokens_ > 0 ? loss_scale / counted_tokens_ : 0.0;
  }
  return mb;
}

// The accumulator's growth since the previous record is this micro batch's loss sum and
// token count (the last stage runs its forwards in micro-batch order).
void PipelineExecutor::record_micro_batch_loss(int64_t microbatch, const Tensor& loss_acc) {
  const Tensor acc = loss_acc.to(Device::cpu);
  const double sum = acc.data<double>()[0], tokens = acc.data<double>()[1];
  double& out = (*mb_losses_)[static_cast<size_t>(microbatch)];
  if (!std::isfinite(mb_loss_sum_))
    out = -1.0;  // the sum is already non-finite: this micro batch cannot be told
  else
    out = tokens > mb_loss_tokens_ ? (sum - mb_loss_sum_) / (tokens - mb_loss_tokens_) : std::nan("");
  mb_loss_sum_ = sum;
  mb_loss_tokens_ = tokens;
}

namespace {
const char* pipe_op_name(schedules::PipeOp op) {
  switch (op) {
    case schedules::PipeOp::recv_forward: return "recv_forward";
    case schedules::PipeOp::forward: return "forward";
    case schedules::PipeOp::send_forward: return "send_forward";
    case schedules::PipeOp::recv_backward: return "recv_backward";
    case schedules::PipeOp::backward: return "backward";
    case schedules::PipeOp::send_backward: return "send_backward";
  }
  return "pipeline";
}
}  // namespace

struct PipelineExecutor::BatchRun {
  static constexpr int kTagActivation = 0, kTagGradient = 1;
  using Key = std::pair<int64_t, int64_t>;  // (microbatch, chunk)

  BatchRun(PipelineExecutor& ex, const data::Batch& batch, int64_t consumed_before, uint64_t step_key,
           double loss_scale, Tensor& loss_acc)
      : ex(ex),
        batch(batch),
        consumed_before(consumed_before),
        step_key(step_key),
        loss_scale(loss_scale),
        loss_acc(loss_acc),
        C(ex.r_.model.hidden_size),
        R(ex.chunks_[0]->local_rows(batch.micro_batch_size)),
        act(ex.chunks_[0]->activation_dtype()),
        backwards_done(ex.chunks_.size(), 0) {}

  PipelineExecutor& ex;
  const data::Batch& batch;
  int64_t consumed_before;
  uint64_t step_key;
  double loss_scale;
  Tensor& loss_acc;
  const int64_t C, R;  // a stage boundary tensor is [R, C] in `act`, the activation dtype
  const DType act;
  std::map<Key, Tensor> act_in, act_out, grad_in, grad_out;
  std::map<size_t, std::pair<std::unique_ptr<parallel::Request>, Tensor>> pending;  // by send action index
  int64_t send_held = 0;                                                            // bytes of the buffers in `pending`
  std::vector<int64_t> backwards_done;  // per chunk: which backward is its last
  std::set<int64_t> graphed;            // micro batches whose forward ran as a CUDA graph

  static Tensor take(std::map<Key, Tensor>& map, Key key) {
    auto it = map.find(key);
    if (it == map.end()) return Tensor();
    Tensor t = it->second;
    map.erase(it);
    return t;
  }

  void recv(const schedules::PipeAction& a, int tag, std::map<Key, Tensor>& into) {
    Tensor t = Tensor::empty({R, C}, act, ex.chunks_[a.chunk]->device());
    ex.g_.pp->recv(t.raw(), t.numel(), act, a.peer_stage, tag);
    into[{a.microbatch, a.chunk}] = t;
  }

  void send(size_t ai, const schedules::PipeAction& a, int tag, std::map<Key, Tensor>& from, const char* what) {
    Tensor t = take(from, {a.microbatch, a.chunk});
    MTNLG_CHECK(t.defined(), "{} of micro batch {} chunk {} before its {}", what, a.microbatch, a.chunk,
                tag == kTagActivation ? "forward" : "backward");
    auto req = ex.g_.pp->isend(t.raw(), t.numel(), t.dtype(), a.peer_stage, tag);
    send_held += t.nbytes();
    ex.peak_send_ = std::max(ex.peak_send_, send_held);
    pending.emplace(ai, std::make_pair(std::move(req), std::move(t)));
  }

  void finish(size_t i) {
    auto it = pending.find(i);
    MTNLG_CHECK(it != pending.end(), "pipeline send {} released twice", i);
    it->second.first->wait();
    send_held -= it->second.second.nbytes();
    pending.erase(it);  // drops this reference to the buffer
  }

  void forward(const schedules::PipeAction& a) {
    auto& chunk = *ex.chunks_[a.chunk];
    const Key key{a.microbatch, a.chunk};
    auto mb = ex.micro_batch(batch, a.microbatch, consumed_before, step_key, loss_scale);
    mb.loss_acc = &loss_acc;
    model::ForwardResult res;
    {
      const timing::StepPartScope part(timing::StepPart::forward);
      // What the forward allocates is counted as activations (the saved tensors and
      // the forward's temporaries); the backward's allocations stay workspace.
      mem::RoleScope role(mem::Role::activations);
      const bool last = a.microbatch + 1 == batch.micro_batches;
      if (ex.graphs_ && !(last && ex.graphs_eager_last_) && ex.graphs_->forward(a.microbatch, mb))
        graphed.insert(a.microbatch);
      else
        res = chunk.forward(a.microbatch, mb, take(act_in, key));
    }
    if (res.output.defined()) act_out[key] = res.output;
    if (ex.mb_losses_ && chunk.spec().has_head) ex.record_micro_batch_loss(a.microbatch, loss_acc);
    int64_t held = graphed.count(a.microbatch) ? ex.graphs_->saved_bytes() : 0;
    for (auto& c : ex.chunks_) held += c->saved_bytes();
    ex.peak_act_ = std::max(ex.peak_act_, held);
  }

  void backward(const schedules::PipeAction& a) {
    auto& chunk = *ex.chunks_[a.chunk];
    const Key key{a.microbatch, a.chunk};
    // The chunk's last micro batch: its parameter gradients become final as this
    // backward passes them (the chunk reports them to its grad-ready hook).
    const bool last = ++backwards_done[static_cast<size_t>(a.chunk)] == batch.micro_batches;
    const timing::StepPartScope part(timing::StepPart::backward);
    if (graphed.erase(a.microbatch)) {  // its forward ran as a graph: so does its backward
      ex.graphs_->backward(a.microbatch);
      return;
    }
    Tensor dx = chunk.backward(a.microbatch, take(grad_in, key), last);
    if (dx.defined() && !(chunk.spec().has_embedding)) grad_out[key] = dx;
  }

  void run(size_t ai, const schedules::PipeAction& a) {
    // Where this rank is, for the flight recorder's rows (parallel/flight_recorder.hpp).
    parallel::device_watchdog().set_phase(a.microbatch, a.chunk, pipe_op_name(a.op));
    switch (a.op) {
      case schedules::PipeOp::recv_forward: {
        mem::RoleScope role(mem::Role::activations);  // kept as the chunk's saved input
        recv(a, kTagActivation, act_in);
        break;
      }
      case schedules::PipeOp::forward: forward(a); break;
      case schedules::PipeOp::send_forward: send(ai, a, kTagActivation, act_out, "send_forward"); break;
      case schedules::PipeOp::recv_backward: recv(a, kTagGradient, grad_in); break;
      case schedules::PipeOp::backward: backward(a); break;
      case schedules::PipeOp::send_backward: send(ai, a, kTagGradient, grad_out, "send_backward"); break;
    }
  }
};

void PipelineExecutor::enable_cuda_graphs(bool eager_last_micro_batch) {
  MTNLG_CHECK(chunks_.size() == 1 && g_.topo.pp() == 1,
              "CUDA graphs need one pipeline stage of one chunk (cuda_graph_refusal checks the recipe first)");
  graphs_ = std::make_unique<MicroBatchGraphs>(*chunks_.front(),
                                               std::vector<parallel::Communicator*>{g_.tp.get(), g_.cp.get()});
  graphs_eager_last_ = eager_last_micro_batch;
}

void PipelineExecutor::run_batch(const data::Batch& batch, int64_t consumed_before, uint64_t step_key,
                                 double loss_scale, Tensor& loss_acc) {
  const int64_t m = batch.micro_batches;
  peak_act_ = 0;
  peak_send_ = 0;
  if (eod_ >= 0) build_loss_masks(batch);
  if (mb_losses_) {
    mb_losses_->assign(static_cast<size_t>(m), std::nan(""));
    const Tensor acc = loss_acc.to(Device::cpu);
    mb_loss_sum_ = acc.data<double>()[0];
    mb_loss_tokens_ = acc.data<double>()[1];
  }
  const int64_t p = g_.topo.pp(), r = g_.coord.pp, v = static_cast<int64_t>(chunks_.size());
  const std::vector<schedules::PipeAction> table = schedules::schedule_for(p, r, m, v);
  // Sends are nonblocking; each buffer stays alive in `pending` until its request is
  // waited for, right after the receive at which this rank knows the peer has started the
  // matching receive (schedules::send_release_points: deadlock-free), else at the end.
  const std::vector<int64_t> release = p > 1 ? schedules::send_release_points(p, r, m, v) : std::vector<int64_t>();
  std::vector<std::vector<size_t>> due(table.size() + 1);
  for (size_t i = 0; i < release.size(); ++i)
    if (release[i] >= 0) due[static_cast<size_t>(release[i])].push_back(i);

  BatchRun run(*this, batch, consumed_before, step_key, loss_scale, loss_acc);
  for (size_t ai = 0; ai < table.size(); ++ai) {
    run.run(ai, table[ai]);
    for (size_t i : due[ai]) run.finish(i);
  }
  for (size_t i : due[table.size()]) run.finish(i);
  MTNLG_CHECK(run.pending.empty(), "{} pipeline send(s) never waited for", run.pending.size());
}

}  // namespace mtnlg::app
