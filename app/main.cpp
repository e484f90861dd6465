// mtnlg entry point: parses the command line, runs one command, maps errors to exit
// codes (0 ok, 1 runtime failure, 2 bad input) with a one-line message on stderr.
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "app/commands.hpp"
#include "core/blas_core.hpp"
#ifdef MTNLG_HAVE_CUDA
#include "core/cuda/cudnn_attention.hpp"
#endif
#include "core/error.hpp"
#include "core/log.hpp"
#include "core/switches.hpp"
#include "config/recipe.hpp"
#include "core/tensor.hpp"

namespace {

// The one-line message of an error that ends the process, and its exit code.
int report(const mtnlg::Error& e) {
  int rank = mtnlg::log::context().rank;
  if (mtnlg::log::context().world > 1)
    std::fprintf(stderr, "mtnlg: error on rank %d: %s\n", rank, e.what());
  else
    std::fprintf(stderr, "mtnlg: error: %s\n", e.what());
  return e.exit_code();
}

}  // namespace

int main(int argc, char** argv) {
  // Before anything else: the environment switches read and checked (a malformed one, or
  // an OpenBLAS core this CPU cannot run, is exit 2), then OpenBLAS's core, which may
  // re-execute this binary with a faster one.
  mtnlg::start_process(argv);
  mtnlg::configure_host_allocator();
  mtnlg::log::context().debug = mtnlg::switches::on(mtnlg::Switch::debug);
  CLI::App app{"mtnlg: train, evaluate and plan GPT models with 3D parallelism (Megatron-Turing NLG style)", "mtnlg"};
  const CLI::Option* verbose = app.add_flag("--verbose")
                                   ->description(
                                       "With --version: also list the environment switches set (MTNLG_*, "
                                       "OPENBLAS_CORETYPE; docs/OPERATIONS.md)");
  // The BLAS line lets a test (or a user) see which kernels this binary multiplies with;
  // a CUDA build adds whether cuDNN (the flash attention form on GPUs) loads here. The
  // text is made only when asked for: loading cuDNN costs every other command nothing.
  app.set_version_flag("--version", [verbose] {
    std::string v = std::string("mtnlg ") + MTNLG_VERSION + "\nCPU matmul: " + mtnlg::blas_description();
#ifdef MTNLG_HAVE_CUDA
    v += "\nattention (flash form on CUDA): " + mtnlg::cuda::cudnn_description();
#endif
    if (verbose->count() > 0) v += "\n" + mtnlg::describe_environment();
    return v;
  });
  app.require_subcommand(1);
  app.fallthrough(false);
  mtnlg::app::register_train(app);
  mtnlg::app::register_eval(app);
  mtnlg::app::register_generate(app);
  mtnlg::app::register_plan(app);
  mtnlg::app::register_data(app);
  mtnlg::app::register_checkpoint(app);
  mtnlg::app::register_report(app);
  mtnlg::app::register_recipe(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "mtnlg: %s (see mtnlg --help)\n", e.what());
    return 2;
  } catch (const mtnlg::Error& e) {
    return report(e);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "mtnlg: error: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mtnlg: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
