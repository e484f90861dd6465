#include "test/support/layouts.hpp"

#include <stdexcept>

namespace mtnlg::test {

namespace {

const std::string kTp2 = "--set parallel.tensor_model_parallel_size=2";
const std::string kTp4 = "--set parallel.tensor_model_parallel_size=4";
const std::string kPp2 = "--set parallel.pipeline_model_parallel_size=2";
const std::string kPp4 = "--set parallel.pipeline_model_parallel_size=4";
const std::string kV = "--set parallel.num_layers_per_virtual_pipeline_stage=1";  // interleaved: one layer a chunk
const std::string kZero1 = "--set parallel.use_distributed_optimizer=true";
const std::string kSp = "--set parallel.sequence_parallel=true";
const std::string kFull = "--set parallel.recompute_granularity=full";
const std::string kSelective = "--set parallel.recompute_granularity=selective";
const std::string kUnfused = "--set model.attention_backend=unfused";
const std::string kCp2 = "--set parallel.context_parallel_size=2";
const std::string kCp4 = "--set parallel.context_parallel_size=4";
const std::string kA2a = "--set parallel.cp_comm_type=a2a";
const std::string kAllGather = "--set parallel.cp_comm_type=all_gather";
// a2a within pairs of cp ranks, the p2p ring across the pairs
const std::string kA2aP2p =
    "--set parallel.cp_comm_type=a2a+p2p --set parallel.hierarchical_context_parallel_sizes=[2,2]";
// expert parallelism (an MoE recipe's; each expert whole on one rank)
const std::string kEp2 = "--set parallel.expert_model_parallel_size=2 --set parallel.expert_tensor_parallel_size=1";
const std::string kEp4 = "--set parallel.expert_model_parallel_size=4 --set parallel.expert_tensor_parallel_size=1";
const std::string kEtp2 = "--set parallel.expert_tensor_parallel_size=2";

}  // namespace

const std::vector<Layout>& all_layouts() {
  static const std::vector<Layout> all = {
      {"single-none", 1, ""},
      {"single-selective", 1, kSelective},
      {"single-full", 1, kFull},
      {"single-unfused", 1, kUnfused},
      {"single-unfused-selective", 1, kUnfused + " " + kSelective},
      {"tp2", 2, kTp2},
      {"tp4", 4, kTp4},
      {"pp2", 2, kPp2},
      {"pp4", 4, kPp4},
      {"pp2-v2", 2, kPp2 + " " + kV},
      {"pp4-v2", 4, kPp4 + " " + kV},
      {"dp2", 2, ""},
      {"dp4", 4, ""},
      {"dp2-zero1", 2, kZero1},
      {"tp2-dp2-sp", 4, kTp2 + " " + kSp},
      {"tp2-dp2-sp-selective", 4, kTp2 + " " + kSp + " " + kSelective},
      {"tp2-pp2-full", 4, kTp2 + " " + kPp2 + " " + kFull},
      {"tp2-pp2-unfused", 4, kUnfused + " " + kTp2 + " " + kPp2},
      {"tp2-pp2-dp2", 8, kTp2 + " " + kPp2},
      {"tp2-pp2-dp2-zero1", 8, kTp2 + " " + kPp2 + " " + kZero1},
      {"tp2-pp2-dp2-recompute", 8, kTp2 + " " + kPp2 + " " + kFull},
      // context parallelism (p2p unless named)
      {"cp2", 2, kCp2},
      {"cp4", 4, kCp4},
      {"cp2-a2a", 2, kCp2 + " " + kA2a},
      {"cp4-a2a+p2p", 4, kCp4 + " " + kA2aP2p},
      {"cp2-allgather", 2, kCp2 + " " + kAllGather},
      {"cp2-tp2-sp", 4, kCp2 + " " + kTp2 + " " + kSp},
      {"cp2-pp2", 4, kCp2 + " " + kPp2},
      {"cp2-pp2-v2-full", 4, kCp2 + " " + kPp2 + " " + kV + " " + kFull},
      {"cp2-dp2-zero1", 4, kCp2 + " " + kZero1},
      // expert parallelism (MoE recipes): ep over dp, over tp's ranks, within stages
      {"ep2", 2, kEp2},
      {"ep4", 4, kEp4},
      {"tp2-sp-ep2", 4, kTp2 + " " + kSp + " " + kEp2},
      {"pp2-ep2", 4, kPp2 + " " + kEp2},
      {"ep2-dp4-zero1", 4, kEp2 + " " + kZero1},
      {"ep4-zero1", 4, kEp4 + " " + kZero1},
      {"pp2-v2-full-ep2", 4, kPp2 + " " + kV + " " + kFull + " " + kEp2},
      {"tp2-sp", 2, kTp2 + " " + kSp},
      // expert tensor parallelism: each expert's width over 2 ranks
      {"etp2", 2, kEtp2},
      {"tp2-sp-etp2", 2, kTp2 + " " + kSp + " " + kEtp2},
      {"etp2-ep2-zero1", 4, "--set parallel.expert_model_parallel_size=2 " + kEtp2 + " " + kZero1},
      // MoE under context parallelism: each cp rank routes its own positions
      {"cp2-ep2", 4, kCp2 + " " + kEp2},
      {"cp2-tp2-sp-ep2", 4, kCp2 + " " + kTp2 + " " + kSp + " " + kEp2},
  };
  return all;
}

std::vector<Layout> layouts(std::initializer_list<std::string_view> names) {
  std::vector<Layout> out;
  for (auto name : names) {
    bool found = false;
    for (const auto& l : all_layouts())
      if (l.name == name) {
        out.push_back(l);
        found = true;
        break;
      }
    if (!found) throw std::invalid_argument("no test layout named " + std::string(name));
  }
  return out;
}

}  // namespace mtnlg::test
