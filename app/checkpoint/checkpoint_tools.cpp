#include "app/checkpoint/checkpoint_tools.hpp"

#include <filesystem>

#include "app/process/module_configs.hpp"
#include "app/process/preflight.hpp"
#include "app/train/trainer.hpp"
#include "core/log.hpp"
#include "core/progress.hpp"
#include "core/ops.hpp"
#include "model/checkpoint.hpp"
#include "model/partition.hpp"
#include "model/gpt.hpp"

namespace fs = std::filesystem;

namespace mtnlg::app {

namespace {

Recipe recipe_of(const model::ckpt::TrainState& st, const std::string& dir) {
  return parse_recipe(st.recipe_yaml, dir + "/metadata.json");
}

// Declares the parameters (pp_rank, tp_rank) holds under recipe r (all virtual chunks).
void declare_rank(model::ParamStore& store, const Recipe& r, int64_t tp_rank, int64_t pp_rank) {
  model::GptConfig cfg = gpt_config(r);
  for (const auto& s : model::partition_chunks(pipeline_split(r), pp_rank))
    model::declare_chunk_params(store, cfg, s, tp_rank, r.tp());
  store.finalize(DType::f32);
}

}  // namespace

std::string convert_checkpoint(const std::string& in, const std::string& out, int64_t tp, int64_t pp) {
  std::string dir = model::ckpt::resolve(in);
  const auto lock = claim_new_checkpoint_root(out, "--output");
  model::ckpt::TrainState st = model::ckpt::read_metadata(dir);
  Recipe r = recipe_of(st, dir);
  r.parallel.tensor_model_parallel_size = tp;
  r.parallel.pipeline_model_parallel_size = pp;
  r.parallel.pipeline_layers.clear();
  r.parallel.num_layers_per_virtual_pipeline_stage = 0;
  r.parallel.use_distributed_optimizer = false;
  validate(r);  // heads % tp, layers % pp, ... with the target layout
  const std::string part = model::ckpt::partial_dir(out, st.iteration);
  fs::remove_all(part);
  Progress prog("convert", tp * pp, "shards");
  prog.set_secondary_unit("params");
  for (int64_t p = 0; p < pp; ++p)
    for (int64_t t = 0; t < tp; ++t) {
      model::ParamStore store;
      declare_rank(store, r, t, p);
      Tensor m = Tensor::zeros({store.numel()}), vv = Tensor::zeros({store.numel()});
      model::ckpt::OptimShard shard{0, store.numel(), &m, &vv};
      bool has_optim = !fs::exists(dir) ? false : [&] {
        for (auto& e : fs::directory_iterator(dir))
          if (e.path().filename().string().rfind("optim_", 0) == 0) return true;
        return false;
      }();
      model::ckpt::load_into(dir, store, has_optim ? &shard : nullptr, &m, &vv);
      auto snap = model::ckpt::take_snapshot(store, &shard, t, p, 0, true, has_optim);
      model::ckpt::write_snapshot(part, snap);
      prog.add(1, store.numel());
    }
  prog.finish();
  st.layout = {tp, pp, 1, 1, false};
  st.recipe_yaml = to_yaml(r);
  model::ckpt::write_metadata(part, st);
  model::ckpt::commit(out, st.iteration, 0);
  return model::ckpt::iteration_dir(out, st.iteration);
}

std::string save_whole_model(const std::string& root, const Recipe& r, const model::ParamStore& store,
                             int64_t iteration) {
  const std::string part = model::ckpt::partial_dir(root, iteration);
  fs::remove_all(part);
  auto snap = model::ckpt::take_snapshot(store, nullptr, 0, 0, 0, true, false);
  model::ckpt::write_snapshot(part, snap);
  model::ckpt::TrainState st;
  if (store.expert_offset() < store.numel()) {  // an MoE model's routed experts: their own file
    model::ckpt::write_snapshot(part, model::ckpt::take_expert_snapshot(store, nullptr, 0, 0, 0, 0, true, false));
    st.layout.ep = 1;
  }
  st.iteration = iteration;
  st.seed = static_cast<uint64_t>(r.training.seed);
  Recipe one = r;
  one.parallel.tensor_model_parallel_size = 1;
  one.parallel.pipeline_model_parallel_size = 1;
  one.parallel.pipeline_layers.clear();
  one.parallel.num_layers_per_virtual_pipeline_stage = 0;
  st.recipe_yaml = to_yaml(one);
  model::ckpt::write_metadata(part, st);
  model::ckpt::commit(root, iteration, 0);
  return model::ckpt::iteration_dir(root, iteration);
}

}  // namespace mtnlg::app
