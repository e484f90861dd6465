// Local (size-1) communicator, byte accounting and launch discovery. Multi-rank
// behaviour is tested under mpirun in test/parallel/mpi/.
#include <catch2/catch.hpp>
#include <map>
#include <string>

#include "core/error.hpp"
#include "parallel/communicator.hpp"

using namespace mtnlg;
using namespace mtnlg::parallel;
using Catch::Matchers::Contains;

TEST_CASE("local communicator: collectives are identities", "[parallel][comm]") {
  LocalCommunicator c("tp");
  CHECK(c.rank() == 0);
  CHECK(c.size() == 1);
  CHECK(c.name() == "tp");
  float f[3] = {1, -2, 3};
  c.all_reduce(f, 3, ReduceOp::sum);
  CHECK(f[1] == -2);
  double d[2] = {1.5, 2.5};
  c.all_reduce(d, 2, ReduceOp::max);
  CHECK(d[0] == 1.5);
  int64_t i[1] = {7};
  c.all_reduce(i, 1, ReduceOp::sum);
  CHECK(i[0] == 7);
  float out[3] = {};
  c.reduce_scatter(f, out, 3);
  CHECK(out[2] == 3);
  float g[3] = {};
  c.all_gather(f, g, 3);
  CHECK(g[0] == 1);
  c.all_gather(g, g, 3);  // in place
  CHECK(g[2] == 3);
  c.broadcast(f, 3, 0);
  c.barrier();
  CHECK_THROWS_AS(c.broadcast(f, 3, 1), RuntimeError);
  CHECK_THROWS_WITH(c.send(f, 3, 0, 1), Contains("no peer"));
  CHECK_THROWS_AS(c.recv(f, 3, 0, 1), RuntimeError);
  CHECK(c.bytes_sent() == 0);  // every ring formula is 0 for one rank
  CHECK(c.split(-1, 0, "x") == nullptr);
  CHECK(c.split(3, 0, "x")->name() == "x");
}

TEST_CASE("local communicator: all_to_all_v copies its one block; counts are checked", "[parallel][comm]") {
  LocalCommunicator c("ep");
  const std::vector<float> in = {1, 2, 3};
  std::vector<float> out(3, 0);
  c.all_to_all_v(in.data(), {3}, out.data(), {3}, DType::f32);
  CHECK(out == in);
  CHECK(c.bytes_sent() == 0);
  CHECK_THROWS_WITH(c.all_to_all_v(in.data(), {3}, out.data(), {2}, DType::f32), Contains("sends 3"));
  CHECK_THROWS_WITH(c.all_to_all_v(in.data(), {3, 0}, out.data(), {3}, DType::f32), Contains("2 send and 1 receive"));
  CHECK_THROWS_WITH(c.all_to_all_v(in.data(), {-1}, out.data(), {-1}, DType::f32), Contains("negative"));
}

TEST_CASE("local communicator: make_groups for a world of one", "[parallel][comm]") {
  auto world = std::make_shared<LocalCommunicator>("world");
  ProcessGroups g = make_groups(world, Topology(1, 1, 1));
  CHECK(g.rank == 0);
  CHECK(g.coord == Coord{0, 0, 0});
  for (auto* c : {&g.tp, &g.pp, &g.dp, &g.embedding, &g.mp}) {
    REQUIRE(*c != nullptr);
    CHECK((*c)->size() == 1);
  }
  CHECK(g.tp->name() == "tp");
  CHECK(g.is_first_stage());
  CHECK(g.is_last_stage());
  CHECK_THROWS_WITH(make_groups(world, Topology(2, 1, 1)), Contains("needs 2 processes"));
}

namespace {
std::map<std::string, std::string> g_env;
const char* fake_getenv(const char* name) {
  auto it = g_env.find(name);
  return it == g_env.end() ? nullptr : it->second.c_str();
}
}  // namespace

TEST_CASE("launch: environment discovery", "[parallel][launch]") {
  g_env.clear();
  auto single = detect_launch(&fake_getenv);
  CHECK(single.launcher == "single");
  CHECK(single.world_size == 1);

  g_env = {{"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}};
  auto m = detect_launch(&fake_getenv);
  CHECK(m.launcher == "mpirun");
  CHECK(m.world_size == 4);
  CHECK(m.rank == 3);
  CHECK(m.local_rank == 1);

  // srun task: step variables present.
  g_env = {{"SLURM_PROCID", "5"},
           {"SLURM_NTASKS", "16"},
           {"SLURM_STEP_NUM_TASKS", "8"},
           {"SLURM_LOCALID", "5"},
           {"SLURM_STEP_ID", "0"}};
  auto s = detect_launch(&fake_getenv);
  CHECK(s.launcher == "srun");
  CHECK(s.world_size == 8);
  CHECK(s.rank == 5);
  CHECK(s.local_rank == 5);

  // Inside an sbatch script (no step): a single process, whatever SLURM_NTASKS says.
  g_env = {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "16"}};
  CHECK(detect_launch(&fake_getenv).launcher == "single");

  g_env = {{"PMI_SIZE", "2"}, {"PMI_RANK", "1"}};
  CHECK(detect_launch(&fake_getenv).rank == 1);

  g_env = {{"OMPI_COMM_WORLD_SIZE", "four"}, {"OMPI_COMM_WORLD_RANK", "0"}};
  CHECK_THROWS_WITH(detect_launch(&fake_getenv), Contains("OMPI_COMM_WORLD_SIZE"));
  g_env = {{"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "2"}};
  CHECK_THROWS_AS(detect_launch(&fake_getenv), InputError);
  g_env.clear();
}

TEST_CASE("launch: a single process gets the Local backend", "[parallel][launch]") {
  auto w = init_world(LaunchInfo{});
  CHECK(w->size() == 1);
  CHECK(w->name() == "world");
  finalize_world();  // nothing to finalise
}
