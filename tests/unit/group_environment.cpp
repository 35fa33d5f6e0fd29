// Unit tests (no device): rdx::group reads a rank's place in the job from
// torchrun's, Open MPI's and Slurm's variables, and names the variable that is
// missing, not a number, or contradicts another.
#include <rdx/group/environment.hpp>

#include <catch2/catch.hpp>

#include <map>
#include <string>

namespace {
// An environment of its own: the tests never read or change the process's.
struct fake_env {
  std::map<std::string, std::string> vars;
  rdx::group::env_reader reader() const {
    return [this](const char* name) -> const char* {
      const auto it = vars.find(name);
      return it == vars.end() ? nullptr : it->second.c_str();
    };
  }
};
const fake_env torchrun{{{"RANK", "5"},
                         {"WORLD_SIZE", "8"},
                         {"LOCAL_RANK", "1"},
                         {"LOCAL_WORLD_SIZE", "4"},
                         {"MASTER_ADDR", "10.77.0.1"},
                         {"MASTER_PORT", "29500"}}};
std::string failure(const fake_env& e) {
  try {
    (void)rdx::group::from_environment(e.reader());
  } catch (const rdx::error& x) {
    CHECK(x.code() == rdx::errc::invalid_argument);
    return x.what();
  }
  return "no error";
}
}  // namespace

TEST_CASE("group: torchrun's variables give rank, size, local rank and size, and the rendezvous") {
  const rdx::group::rank_info r = rdx::group::from_environment(torchrun.reader());
  CHECK(r.from == rdx::group::launcher::torchrun);
  CHECK(r.rank == 5);
  CHECK(r.size == 8);
  CHECK(r.local_rank == 1);
  CHECK(r.local_size == 4);
  CHECK(r.rendezvous_host == "10.77.0.1");
  CHECK(r.rendezvous_port == 29500);
}

TEST_CASE("group: a missing, malformed or contradictory torchrun variable is named") {
  for (const char* v : {"WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) {
    fake_env e = torchrun;
    e.vars.erase(v);
    INFO(v);
    CHECK_THAT(failure(e), Catch::Contains(std::string(v) + " is not set") && Catch::Contains("torchrun"));
  }
  fake_env e = torchrun;
  e.vars["RANK"] = "3x";
  CHECK_THAT(failure(e), Catch::Contains("RANK=\"3x\" is not a whole number"));
  e = torchrun;
  e.vars["WORLD_SIZE"] = "-1";
  CHECK_THAT(failure(e), Catch::Contains("WORLD_SIZE=\"-1\""));
  e = torchrun;
  e.vars["RANK"] = "8";
  CHECK_THAT(failure(e), Catch::Contains("rank 8 is not below the job's size 8"));
  e = torchrun;
  e.vars["LOCAL_RANK"] = "4";
  CHECK_THAT(failure(e), Catch::Contains("local rank 4 is not below the ranks on this host, 4"));
  e = torchrun;
  e.vars["LOCAL_WORLD_SIZE"] = "9";
  CHECK_THAT(failure(e), Catch::Contains("9 ranks on this host, more than the job's 8"));
  e = torchrun;
  e.vars["MASTER_PORT"] = "70000";
  CHECK_THAT(failure(e), Catch::Contains("MASTER_PORT=\"70000\""));
  e = torchrun;
  e.vars["MASTER_PORT"] = "0";
  CHECK_THAT(failure(e), Catch::Contains("MASTER_PORT=0"));
  e = torchrun;
  e.vars["WORLD_SIZE"] = "0";
  CHECK_THAT(failure(e), Catch::Contains("0 ranks"));
}

TEST_CASE("group: Open MPI's variables, with a rendezvous only when both MASTER_ variables are set") {
  fake_env e{{{"OMPI_COMM_WORLD_RANK", "3"},
              {"OMPI_COMM_WORLD_SIZE", "8"},
              {"OMPI_COMM_WORLD_LOCAL_RANK", "3"},
              {"OMPI_COMM_WORLD_LOCAL_SIZE", "8"}}};
  rdx::group::rank_info r = rdx::group::from_environment(e.reader());
  CHECK(r.from == rdx::group::launcher::open_mpi);
  CHECK(r.rank == 3);
  CHECK(r.size == 8);
  CHECK(r.local_rank == 3);
  CHECK(r.local_size == 8);
  CHECK(r.rendezvous_host.empty());
  CHECK(r.rendezvous_port == 0);
  e.vars["MASTER_ADDR"] = "node0";
  CHECK_THAT(failure(e), Catch::Contains("MASTER_PORT is not set") && Catch::Contains("Open MPI"));
  e.vars["MASTER_PORT"] = "18515";
  r = rdx::group::from_environment(e.reader());
  CHECK(r.rendezvous_host == "node0");
  CHECK(r.rendezvous_port == 18515);
  e.vars.erase("MASTER_ADDR");
  CHECK_THAT(failure(e), Catch::Contains("MASTER_PORT is set but MASTER_ADDR is not"));
  e.vars.erase("MASTER_PORT");
  e.vars.erase("OMPI_COMM_WORLD_LOCAL_SIZE");
  CHECK_THAT(failure(e), Catch::Contains("OMPI_COMM_WORLD_LOCAL_SIZE is not set"));
}

TEST_CASE("group: Slurm's variables, the ranks on this node from SLURM_STEP_TASKS_PER_NODE") {
  fake_env e{{{"SLURM_PROCID", "6"},
              {"SLURM_NTASKS", "7"},
              {"SLURM_LOCALID", "0"},
              {"SLURM_NODEID", "3"},
              {"SLURM_STEP_TASKS_PER_NODE", "2(x3),1"},
              {"SLURM_STEP_NODELIST", "node[0-3]"}}};
  rdx::group::rank_info r = rdx::group::from_environment(e.reader());
  CHECK(r.from == rdx::group::launcher::slurm);
  CHECK(r.rank == 6);
  CHECK(r.size == 7);
  CHECK(r.local_size == 1);
  CHECK(r.nodelist == "node[0-3]");
  e.vars["SLURM_NODEID"] = "1";
  e.vars["SLURM_PROCID"] = "3";
  e.vars["SLURM_LOCALID"] = "1";
  CHECK(rdx::group::from_environment(e.reader()).local_size == 2);
  e.vars["SLURM_NODEID"] = "4";
  CHECK_THAT(failure(e), Catch::Contains("names no node 4 (SLURM_NODEID)"));
  e.vars["SLURM_NODEID"] = "0";
  for (const char* bad : {"2(x", "2(x0)", "(x2)", "2x3", "", "2(x3),"}) {
    e.vars["SLURM_STEP_TASKS_PER_NODE"] = bad;
    INFO(bad);
    CHECK_THAT(failure(e), Catch::Contains("SLURM_STEP_TASKS_PER_NODE"));
  }
  e.vars.erase("SLURM_STEP_TASKS_PER_NODE");
  CHECK_THAT(failure(e), Catch::Contains("SLURM_STEP_TASKS_PER_NODE is not set"));
}

TEST_CASE("group: torchrun's variables win over the others; none at all is named as such") {
  fake_env e = torchrun;
  e.vars["OMPI_COMM_WORLD_RANK"] = "0";
  e.vars["SLURM_PROCID"] = "0";
  CHECK(rdx::group::from_environment(e.reader()).from == rdx::group::launcher::torchrun);
  const std::string none = failure(fake_env{});
  CHECK_THAT(none, Catch::Contains("no launcher's variables") && Catch::Contains("RANK") &&
                       Catch::Contains("OMPI_COMM_WORLD_RANK") && Catch::Contains("SLURM_PROCID") &&
                       Catch::Contains("rdx::group::given"));
}

TEST_CASE("group: values given by the program are checked the same way") {
  const rdx::group::rank_info r = rdx::group::given(2, 4, 0, 2, "10.77.0.1", 18515);
  CHECK(r.from == rdx::group::launcher::given);
  CHECK(r.rank == 2);
  CHECK(r.rendezvous_port == 18515);
  CHECK_THROWS_WITH(rdx::group::given(4, 4, 0, 1), Catch::Contains("rank 4 is not below the job's size 4"));
  CHECK_THROWS_WITH(rdx::group::given(0, 4, 1, 2), Catch::Contains("local rank 1 above the rank 0"));
  CHECK_THROWS_WITH(rdx::group::given(0, 0, 0, 1), Catch::Contains("0 ranks"));
}
