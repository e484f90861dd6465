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
#include "config/recipe.hpp"
#include "core/tensor.hpp"

int main(int argc, char** argv) {
  // Before anything else: may re-execute this binary with a faster OpenBLAS kernel.
  mtnlg::select_blas_core(argv);
  mtnlg::configure_host_allocator();
  if (const char* d = std::getenv("MTNLG_DEBUG"))  // 1, or a boolean spelling
    mtnlg::log::context().debug = std::string(d) == "1" || mtnlg::parse_bool(d).value_or(false);
  CLI::App app{"mtnlg: train, evaluate and plan GPT models with 3D parallelism (Megatron-Turing NLG style)", "mtnlg"};
  // The BLAS line lets a test (or a user) see which kernels this binary multiplies with;
  // a CUDA build adds whether cuDNN (the flash attention form on GPUs) loads here. The
  // text is made only when asked for: loading cuDNN costs every other command nothing.
  app.set_version_flag("--version", [] {
    std::string v = std::string("mtnlg ") + MTNLG_VERSION + "\nCPU matmul: " + mtnlg::blas_description();
#ifdef MTNLG_HAVE_CUDA
    v += "\nattention (flash form on CUDA): " + mtnlg::cuda::cudnn_description();
#endif
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
    int rank = mtnlg::log::context().rank;
    if (mtnlg::log::context().world > 1)
      std::fprintf(stderr, "mtnlg: error on rank %d: %s\n", rank, e.what());
    else
      std::fprintf(stderr, "mtnlg: error: %s\n", e.what());
    return e.exit_code();
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "mtnlg: error: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mtnlg: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
