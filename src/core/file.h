#pragma once
// Files written so that nothing already there is lost: the bytes go to
// "<path>.tmp.<pid>", are flushed, and the temporary is renamed over `path`
// only when complete.

#include <string>
#include <string_view>

#include "core/status.h"

namespace mt {

Status write_file_atomic(const std::string& path, std::string_view data);

}  // namespace mt
