#include "transports/ucx/ucx_info.h"

#include <dlfcn.h>
#include <ucp/api/ucp.h>
#include <uct/api/uct.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "transports/ucx/ucx_status.h"

namespace ucxb::ucx {

std::string libraryVersion() { return ucp_get_version_string(); }

std::string libraryPath() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&ucp_get_version_string), &info) != 0 &&
      info.dli_fname != nullptr) {
    return info.dli_fname;
  }
  return {};
}

namespace {

void addMemoryDomain(uct_component_h component, const char* mdName,
                     std::vector<std::pair<std::string, std::string>>& out) {
  uct_md_config_t* config = nullptr;
  if (uct_md_config_read(component, nullptr, nullptr, &config) != UCS_OK) {
    return;
  }
  uct_md_h md = nullptr;
  const ucs_status_t opened = uct_md_open(component, mdName, config, &md);
  uct_config_release(config);
  if (opened != UCS_OK) {
    return;  // e.g. a CUDA domain on a machine without a GPU
  }
  uct_tl_resource_desc_t* resources = nullptr;
  unsigned count = 0;
  if (uct_md_query_tl_resources(md, &resources, &count) == UCS_OK) {
    for (unsigned i = 0; i < count; ++i) {
      out.emplace_back(resources[i].tl_name, resources[i].dev_name);
    }
    uct_release_tl_resource_list(resources);
  }
  uct_md_close(md);
}

}  // namespace

std::vector<std::pair<std::string, std::string>> transports() {
  std::vector<std::pair<std::string, std::string>> out;
  uct_component_h* components = nullptr;
  unsigned numComponents = 0;
  check(uct_query_components(&components, &numComponents), "uct_query_components");
  for (unsigned c = 0; c < numComponents; ++c) {
    uct_component_attr_t attr{};
    attr.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT;
    if (uct_component_query(components[c], &attr) != UCS_OK) {
      continue;
    }
    std::vector<uct_md_resource_desc_t> mds(attr.md_resource_count);
    attr.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCES;
    attr.md_resources = mds.data();
    if (uct_component_query(components[c], &attr) != UCS_OK) {
      continue;
    }
    for (const auto& md : mds) {
      addMemoryDomain(components[c], md.md_name, out);
    }
  }
  uct_release_component_list(components);
  return out;
}

std::vector<std::string> contextTransports(ucp_context_h context) {
  char* text = nullptr;
  size_t size = 0;
  FILE* stream = ::open_memstream(&text, &size);
  if (stream == nullptr) return {};
  ucp_context_print_info(context, stream);
  std::fclose(stream);  // sets text and size
  const std::string printed(text != nullptr ? text : "", size);
  std::free(text);
  // A resource line reads "#      resource 1  :  md 1  dev 1  flags -- tcp/eth0".
  std::vector<std::string> names;
  std::istringstream lines(printed);
  for (std::string line; std::getline(lines, line);) {
    if (line.find(" resource ") == std::string::npos) continue;
    const size_t dashes = line.rfind("-- ");
    const size_t slash = line.find('/', dashes);
    if (dashes == std::string::npos || slash == std::string::npos) continue;
    std::string name = line.substr(dashes + 3, slash - dashes - 3);
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  }
  return names;
}

}  // namespace ucxb::ucx
