// `mtnlg checkpoint inspect|convert|export|import|logits|verify-resume`
#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>

#include "app/checkpoint/checkpoint_tools.hpp"
#include "app/checkpoint/hf_interchange.hpp"
#include "app/checkpoint/verify_resume.hpp"
#include "app/commands.hpp"
#include "app/eval/eval_runner.hpp"
#include "app/process/placement.hpp"
#include "core/safetensors.hpp"
#include "model/inference.hpp"
#include "core/log.hpp"
#include "core/progress.hpp"
#include "model/checkpoint.hpp"

namespace mtnlg::app {

namespace {

// `checkpoint inspect`: the metadata, per-file tensor counts and checksum status (every
// tensor with `tensors`); InputError on a bad checksum or a missing shard file.
void inspect_checkpoint(const std::string& input, bool tensors) {
  std::string dir = model::ckpt::resolve(input);
  auto st = model::ckpt::read_metadata(dir);
  std::printf("checkpoint %s\n  iteration %lld | consumed samples %lld, tokens %s | optimizer steps %lld\n",
              dir.c_str(), static_cast<long long>(st.iteration), static_cast<long long>(st.consumed_samples),
              human_count(static_cast<double>(st.consumed_tokens)).c_str(), static_cast<long long>(st.optimizer_steps));
  const std::string more =
      (st.layout.cp > 1 ? fmt::format(" cp={}", st.layout.cp) : "") +
      (st.layout.ep > 0 ? fmt::format(" ep={} (experts: {} replicas)", st.layout.ep, st.layout.edp) : "");
  std::printf("  layout tp=%lld pp=%lld dp=%lld%s%s | skipped %lld | format version %d\n",
              static_cast<long long>(st.layout.tp), static_cast<long long>(st.layout.pp),
              static_cast<long long>(st.layout.dp), more.c_str(), st.layout.zero1 ? " ZeRO-1" : "",
              static_cast<long long>(st.skipped_total), model::ckpt::kFormatVersion);
  auto rep = model::ckpt::inspect(dir);
  std::map<std::string, std::tuple<int64_t, int64_t, int64_t>> per_file;  // tensors, elements, bad checksums
  int64_t bad = 0;
  for (auto& t : rep) {
    int64_t n = 1;
    for (auto d : t.shape) n *= d;
    auto& [c, e, b] = per_file[t.file];
    ++c;
    e += n;
    if (!t.checksum_ok) {
      ++b;
      ++bad;
    }
    if (tensors)
      std::printf("  %-40s %-50s %s %-18s of %-18s split %lld %s\n", t.file.c_str(), t.name.c_str(), t.dtype.c_str(),
                  shape_str(t.shape).c_str(), shape_str(t.global_shape).c_str(), static_cast<long long>(t.split_dim),
                  t.checksum_ok ? "ok" : "CHECKSUM MISMATCH");
  }
  for (auto& [f, v] : per_file)
    std::printf("  %-44s %5lld tensors %12s elements  checksums %s\n", f.c_str(),
                static_cast<long long>(std::get<0>(v)), human_count(static_cast<double>(std::get<1>(v))).c_str(),
                std::get<2>(v) ? "MISMATCH" : "ok");
  if (bad) throw_input("{}: {} tensors fail their checksum", dir, bad);
  // Checksums cover the files present; the layout says which must be there.
  auto miss = model::ckpt::missing_files(dir, st);
  for (auto& m : miss) std::printf("  %-44s MISSING\n", m.c_str());
  if (!miss.empty())
    throw_input("{}: {} of the shard files its layout (tp={} pp={} dp={}) needs are missing, e.g. {}", dir, miss.size(),
                st.layout.tp, st.layout.pp, st.layout.dp, miss.front());
}

// `--tokens 464,3290,318` -> ids; InputError naming the bad entry.
std::vector<int32_t> parse_token_ids(const std::string& text) {
  std::vector<int32_t> toks;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t end = std::min(text.find(',', pos), text.size());
    const std::string t = text.substr(pos, end - pos);
    char* stop = nullptr;
    const long long v = std::strtoll(t.c_str(), &stop, 10);
    if (t.empty() || *stop != '\0' || v < 0 || v > INT32_MAX)
      throw_input("--tokens: \"{}\" is not a token id (comma-separated non-negative integers)", t);
    toks.push_back(static_cast<int32_t>(v));
    pos = end + 1;
  }
  return toks;
}

// `checkpoint logits`: the model's logits for one token sequence, as safetensors.
void write_logits(const std::string& input, const std::vector<int32_t>& toks, const std::string& output,
                  const std::string& device) {
  model::LoadedModel lm = load_eval_model(input, "", {});
  const int64_t T = static_cast<int64_t>(toks.size()), V = lm.cfg.vocab_size;
  if (T > lm.cfg.max_positions)
    throw_input("--tokens: {} tokens exceed the model's {} positions", T, lm.cfg.max_positions);
  for (int32_t t : toks)
    if (t >= V) throw_input("--tokens: id {} is outside the vocabulary (size {})", t, V);
  lm.store.place(select_device(parse_device_kind(device, "--device"), "--device"));
  auto chunk = model::whole_model_chunk(lm.cfg, lm.store);
  std::vector<int64_t> rows(static_cast<size_t>(T));
  for (int64_t i = 0; i < T; ++i) rows[static_cast<size_t>(i)] = i;
  const Tensor padded = model::logits_at(*chunk, toks.data(), 1, T, rows);  // [T, padded vocab], host f32
  Tensor logits = Tensor::empty({1, T, V});
  for (int64_t i = 0; i < T; ++i)
    std::copy(padded.data<float>() + i * padded.dim(1), padded.data<float>() + i * padded.dim(1) + V,
              logits.data<float>() + i * V);
  Tensor tt = Tensor::empty({1, T}, DType::i32);
  std::copy(toks.begin(), toks.end(), tt.data<int32_t>());
  safetensors::write(output, {{"tokens", tt}, {"logits", logits}}, {{"format", "mtnlg-logits"}});
  std::printf("wrote %s (%lld tokens x %lld logits, %s)\n", output.c_str(), static_cast<long long>(T),
              static_cast<long long>(V), describe_device(lm.store.params().device()).c_str());
}

}  // namespace

namespace {

// The options the file-converting subcommands share.
struct CheckpointArgs {
  std::string input, output, format = "hf", recipe;
  std::string dtype = "fp32", max_shard_size = "5GB";
  int64_t bos = -1, eos = -1;
  int64_t tp = 1, pp = 1;
  bool tensors = false;
  std::string tokens, device = "auto";
};

// inspect: a checkpoint's layout, tensors and checksums.
void register_inspect(CLI::App* cmd, const std::shared_ptr<CheckpointArgs>& a) {
  auto* ins = cmd->add_subcommand("inspect", "Layout, iteration, tensors, sizes and checksum status of a checkpoint");
  ins->add_option("checkpoint", a->input, "Checkpoint root (uses `latest`) or an iter_XXXXXXX directory")->required();
  ins->add_flag("--tensors", a->tensors, "List every tensor (default: a summary per file)");
  ins->callback([a] { inspect_checkpoint(a->input, a->tensors); });
}

// convert: another tensor/pipeline layout, offline.
void register_convert(CLI::App* cmd, const std::shared_ptr<CheckpointArgs>& a) {
  auto* conv = cmd->add_subcommand("convert", "Rewrite a checkpoint for another tensor/pipeline layout (offline)");
  conv->add_option("--input", a->input, "Checkpoint root or iteration directory (any layout)")->required();
  conv->add_option("--output", a->output, "Output checkpoint root")->required();
  conv->add_option("--tp", a->tp, "Target tensor_model_parallel_size")->check(CLI::PositiveNumber);
  conv->add_option("--pp", a->pp, "Target pipeline_model_parallel_size")->check(CLI::PositiveNumber);
  conv->callback([a] {
    std::string d = convert_checkpoint(a->input, a->output, a->tp, a->pp);
    std::printf("wrote %s (tp=%lld pp=%lld)\n", d.c_str(), static_cast<long long>(a->tp),
                static_cast<long long>(a->pp));
  });
}

// export: a Hugging Face model directory.
void register_export(CLI::App* cmd, const std::shared_ptr<CheckpointArgs>& a) {
  auto* ex = cmd->add_subcommand(
      "export",
      "Export to a Hugging Face model directory (config.json + model.safetensors, sharded with "
      "model.safetensors.index.json above --max-shard-size): GPT2LMHeadModel for a GPT-2-family checkpoint, "
      "LlamaForCausalLM for a Llama-family one (rope + RMSNorm + swiglu), Qwen2ForCausalLM when it has "
      "q/k/v biases alone (add_qkv_bias), Qwen3ForCausalLM when it has per-head q/k norms (qk_layernorm)");
  ex->add_option("--format", a->format, "hf: the family the checkpoint's recipe says; hf-gpt2: GPT-2 only")
      ->check(CLI::IsMember(std::vector<std::string>(std::begin(kHfFormats), std::end(kHfFormats))))
      ->capture_default_str();
  ex->add_option("--input", a->input, "Checkpoint root or iteration directory (any layout)")->required();
  ex->add_option("--output", a->output,
                 "Output directory (created; earlier model*.safetensors and index there are removed)")
      ->required();
  ex->add_option("--dtype", a->dtype, "fp32|bf16: the weights' dtype (config.json's torch_dtype)")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  ex->add_option("--max-shard-size", a->max_shard_size,
                 "Largest weights file: bigger exports are split into model-0000i-of-0000n.safetensors with "
                 "model.safetensors.index.json (units B, KB, MB, GB, TB; KiB ... TiB)")
      ->capture_default_str();
  ex->add_option("--bos-token-id", a->bos,
                 "config.json's bos_token_id (default: from the hf_config.json an import kept "
                 "in the checkpoint root, else 50256 for a GPT-2 model or a 50257-token vocabulary, else null)")
      ->check(CLI::NonNegativeNumber);
  ex->add_option("--eos-token-id", a->eos, "config.json's eos_token_id (default: as --bos-token-id)")
      ->check(CLI::NonNegativeNumber);
  ex->footer(
      "A tokenizer.json (+ tokenizer_config.json) in the checkpoint root is copied along. What Hugging Face's "
      "classes cannot express (e.g. rope with LayerNorm, interleaved rotary pairs, partial rotary) is exit 2 "
      "naming the recipe key.");
  ex->callback([a] {
    HfExportOptions o;
    o.format = a->format;
    o.dtype = a->dtype == "bf16" ? DType::bf16 : DType::f32;
    o.max_shard_bytes = parse_byte_size(a->max_shard_size, "--max-shard-size");
    o.bos_token_id = a->bos;
    o.eos_token_id = a->eos;
    for (const auto& f : export_hf(a->input, a->output, o)) std::printf("wrote %s\n", f.c_str());
  });
}

// import: a Hugging Face model directory as a checkpoint.
void register_import(CLI::App* cmd, const std::shared_ptr<CheckpointArgs>& a) {
  auto* im = cmd->add_subcommand(
      "import",
      "Import a Hugging Face model directory (GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM or "
      "Qwen3ForCausalLM, by "
      "config.json's architectures / model_type; model.safetensors or shards with "
      "model.safetensors.index.json; F32, BF16 or F16) as an mtnlg checkpoint (iteration 0); its "
      "tokenizer.json (+ tokenizer_config.json), when there, is copied beside it for eval and generate");
  im->add_option("--format", a->format, "hf: the family config.json says; hf-gpt2: GPT-2 only")
      ->check(CLI::IsMember(std::vector<std::string>(std::begin(kHfFormats), std::end(kHfFormats))))
      ->capture_default_str();
  im->add_option("--input", a->input, "Directory with config.json and the weights")->required();
  im->add_option("--output", a->output, "Output checkpoint root")->required();
  im->add_option("--recipe", a->recipe,
                 "Recipe to record (its model section must match config.json); default: built from config.json");
  im->footer(
      "config.json is kept as OUTPUT/hf_config.json (a later export takes its bos/eos token ids). A field mtnlg's "
      "model cannot express (e.g. hidden_act other than silu, rope_scaling other than "
      "llama3 with Llama 3.1's frequency factors, attention_bias without mlp_bias (Llama) or at all (Qwen3), "
      "use_sliding_window; another architecture, such as OLMo 2's) is exit 2 "
      "naming it.");
  im->callback([a] {
    std::string d = import_hf(a->input, a->output, a->recipe, a->format);
    std::printf("wrote %s\n", d.c_str());
    if (std::filesystem::exists(std::filesystem::path(a->output) / "tokenizer.json"))
      std::printf("copied tokenizer.json to %s (eval and generate use it)\n", a->output.c_str());
  });
}

// logits: the model's logits for a token sequence.
void register_logits(CLI::App* cmd, const std::shared_ptr<CheckpointArgs>& a) {
  auto* lg = cmd->add_subcommand(
      "logits",
      "Write the model's logits for a token sequence (safetensors: tokens [1,T] i32, logits [1,T,vocab] f32), "
      "to compare an export or another framework with mtnlg");
  lg->add_option("--input", a->input, "Checkpoint root or iteration directory (any layout)")->required();
  lg->add_option("--tokens", a->tokens, "Comma-separated token ids, e.g. 464,3290,318")->required();
  lg->add_option("--output", a->output, "Output .safetensors file")->required();
  lg->add_option("--device", a->device, "auto|cpu|cuda|test: where the forward runs")->capture_default_str();
  lg->callback([a] { write_logits(a->input, parse_token_ids(a->tokens), a->output, a->device); });
}

// inspect, convert, export, import, logits: each a callback on a named function; they
// share one set of options.
void register_file_tools(CLI::App* cmd) {
  auto a = std::make_shared<CheckpointArgs>();
  register_inspect(cmd, a);
  register_convert(cmd, a);
  register_export(cmd, a);
  register_import(cmd, a);
  register_logits(cmd, a);
}

void register_verify_resume(CLI::App* cmd) {
  auto v = std::make_shared<VerifyResumeOptions>();
  auto* vr = cmd->add_subcommand(
      "verify-resume",
      "Train K iterations from a checkpoint under layout A and under layout B (each a child `mtnlg train`) and compare "
      "their losses and grad norms iteration by iteration: exit 0 when they agree within --tolerance, 1 when not");
  vr->add_option("checkpoint", v->checkpoint, "Checkpoint root (uses `latest`) or an iter_XXXXXXX directory; only read")
      ->required();
  vr->add_option("--recipe", v->recipe, "The recipe the checkpoint was trained with (its model must match)")
      ->required();
  vr->add_option("--layout-a", v->layout_a,
                 "First layout: tp=T,pp=P,dp=D[,cp=C][,ep=E][,zero1=0|1][,sp=0|1] (tp/pp/dp/cp default 1, cp = "
                 "parallel.context_parallel_size; ep = parallel.expert_model_parallel_size; zero1 = "
                 "parallel.use_distributed_optimizer, sp = parallel.sequence_parallel, as the recipe when not given)")
      ->capture_default_str();
  vr->add_option("--layout-b", v->layout_b, "Second layout, e.g. \"tp=2,pp=2,dp=2,zero1=1\"")->required();
  vr->add_option("--iters", v->iters, "Iterations to train from the checkpoint under each layout")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  vr->add_option("--set", v->sets,
                 "Override a recipe key for both runs (section.key=value, as `mtnlg train --set`); repeatable; the "
                 "layout's keys win");
  vr->add_option("--launcher", v->launcher,
                 "Command line that starts a multi-process run, {n} = tp x pp x dp (a one-process layout runs plainly)")
      ->capture_default_str();
  vr->add_option("--tolerance", v->tolerance, "Largest relative difference |A-B|/max(|A|,|B|) of loss and grad norm")
      ->capture_default_str();
  vr->add_option("--work-dir", v->work_dir,
                 "Where the runs write WORK/layout-a and WORK/layout-b (metrics.jsonl, train.log); default: a fresh "
                 "directory under $TMPDIR");
  vr->footer(
      "Each run loads the checkpoint (resolved once to its iteration directory) with its own logging.dir and "
      "checkpoint.save under the work directory, so the checkpoint is never written; it stops after K iterations "
      "with training.exit_interval, keeping the recipe's LR schedule. Validation and TensorBoard are off, "
      "metrics.jsonl logs every iteration. A missing or incompatible checkpoint (another model than the recipe), a "
      "layout that does not divide the model or the batch, or a bad option is exit 2 before any run starts. "
      "Example:\n  mtnlg checkpoint verify-resume runs/x/checkpoints --recipe x.yaml --layout-a tp=1,pp=1,dp=1 "
      "--layout-b tp=2,pp=2,dp=2,zero1=1 --launcher \"mpirun -np {n}\"");
  vr->callback([v] { verify_resume(*v); });
}

}  // namespace

void register_checkpoint(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "checkpoint",
      "Inspect, convert (tp/pp), export to / import from Hugging Face (GPT-2, Llama, Qwen2), verify a resume under "
      "another layout");
  cmd->require_subcommand(1);
  register_file_tools(cmd);
  register_verify_resume(cmd);
}

}  // namespace mtnlg::app
