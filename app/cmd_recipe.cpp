// `mtnlg recipe show|validate`
#include <cstdio>

#include "app/commands.hpp"
#include "config/recipe.hpp"

namespace mtnlg::app {

void register_recipe(CLI::App& app) {
  auto* cmd = app.add_subcommand("recipe", "Show the resolved recipe or validate recipe files");
  cmd->require_subcommand(1);

  auto* show = cmd->add_subcommand("show", "Print the resolved recipe (defaults filled in, --set applied) as YAML");
  static std::string show_path;
  static std::vector<std::string> show_sets;
  show->add_option("recipe", show_path, "Recipe YAML file")->required();
  show->add_option("--set", show_sets, "Override a key: section.key=value (value parsed as YAML); repeatable");
  show->callback([] {
    Recipe r = load_recipe(show_path, show_sets);
    for (auto& n : r.notes) std::printf("# %s\n", n.c_str());
    std::fputs(to_yaml(r).c_str(), stdout);
  });

  auto* val = cmd->add_subcommand("validate", "Check recipe files; exit 2 naming file:line:col on the first problem");
  static std::vector<std::string> val_paths;
  static std::vector<std::string> val_sets;
  static int64_t val_world = 0;
  val->add_option("recipes", val_paths, "Recipe YAML files")->required();
  val->add_option("--set", val_sets, "Override a key: section.key=value; repeatable");
  val->add_option("--world-size", val_world, "Also check the layout for this many processes");
  val->callback([] {
    for (auto& p : val_paths) {
      Recipe r = load_recipe(p, val_sets);
      if (val_world > 0) validate_layout(r, val_world);
      std::printf("%s: ok\n", p.c_str());
    }
  });
}

}  // namespace mtnlg::app
